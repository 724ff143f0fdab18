from tests.model.conftest import tokenizer_json  # noqa: F401 - the tiny models' tokenizer fixture
