"""Fixtures shared by the model tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    """A tokenizer.json for the tiny model directories (the forward tests do not depend on it)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(384)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    t.save(str(path))
    return path
