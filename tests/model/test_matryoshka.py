"""Matryoshka models (model/matryoshka.py): what a config.json (or hf_overrides over it) declares,
and which `dimensions` a request may then ask for, as vLLM decides it."""

from __future__ import annotations

import pytest

from corellm.model.hf_dir import HFModelDir
from corellm.model.matryoshka import check_dimensions, read_matryoshka_dimensions
from corellm.pooling_params import PoolingParams
from tests.model.test_bert import make_encoder, write_bert_tokenizer


@pytest.mark.parametrize("cfg, want", [
    ({}, None),
    ({"is_matryoshka": False}, None),
    ({"is_matryoshka": True}, ()),
    ({"matryoshka_dimensions": [64, 16, 32, 16]}, (16, 32, 64)),
    ({"matryoshka_dimensions": [], "is_matryoshka": True}, ()),
])
def test_what_a_config_declares(cfg, want):
    assert read_matryoshka_dimensions(cfg, "config.json", 64) == want


@pytest.mark.parametrize("cfg, says", [
    ({"is_matryoshka": "yes"}, "is_matryoshka must be true or false"),
    ({"matryoshka_dimensions": [0, 8]}, "matryoshka_dimensions must be a list of lengths from 1 to the hidden size"),
    ({"matryoshka_dimensions": [128]}, r"hidden size \(64\)"),
    ({"matryoshka_dimensions": 32}, "must be a list"),
])
def test_a_bad_declaration_is_refused(cfg, says):
    with pytest.raises(ValueError, match=says):
        read_matryoshka_dimensions(cfg, "config.json", 64)


def test_which_dimensions_a_request_may_ask_for():
    check_dimensions(1, 64, ())
    check_dimensions(64, 64, ())
    check_dimensions(16, 64, (16, 32))
    for n, allowed, says in ((8, None, "not a Matryoshka embedding model"), (65, (), "1 to 64 values, got 65"),
                             (8, (16, 32), r"lengths \[16, 32\], got 8")):
        with pytest.raises(ValueError, match=says):
            check_dimensions(n, 64, allowed)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="dimensions must be a positive integer"):
            PoolingParams(dimensions=bad)
    with pytest.raises(ValueError, match="task 'classify' takes none"):
        PoolingParams(task="classify", dimensions=8)


def test_hf_overrides_declare_a_model_matryoshka(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "tok").mkdir()
    (tmp_path / "model").mkdir()
    make_encoder("bert", tmp_path / "model", write_bert_tokenizer(tmp_path / "tok"))
    tmp_path = tmp_path / "model"
    assert HFModelDir(tmp_path).config().matryoshka_dimensions is None
    assert HFModelDir(tmp_path, {"is_matryoshka": True}).config().matryoshka_dimensions == ()
    assert HFModelDir(tmp_path, {"matryoshka_dimensions": [32]}).config().matryoshka_dimensions == (32,)
