"""The structured-output tests' grammar compiler for SmolLM2's tokenizer, and what a compiled
grammar accepts."""

from __future__ import annotations

import pytest

from corellm.model.gguf_file import GGUFModelFile
from corellm.model.loader import default_model_path
from corellm.structured_output import GrammarCompiler


@pytest.fixture(scope="module")
def compiler():
    tok = GGUFModelFile(default_model_path()).tokenizer()
    c = GrammarCompiler(tok, 49152, [tok.eos_token_id])
    yield c
    c.shutdown()


def accepts(compiler: GrammarCompiler, spec, text: str) -> bool:
    """Whether the spec's grammar (a fresh matcher) takes every token of the text and may end there."""
    matcher = compiler.matcher_future(spec).result()
    ids = compiler.tokenizer.encode(text, add_special_tokens=False)
    if matcher.validate_tokens(ids) != len(ids):
        return False
    matcher.consume_tokens(ids)
    return matcher.is_accepting()
