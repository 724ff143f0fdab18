"""corellm's GGUF reader (model/gguf_reader.py) gives what the `gguf` package's reader gives —
every key's value, every tensor's name, type, dims and data — on the default model and on a file
with every kind of value; a file that is not GGUF is refused."""

from __future__ import annotations

import numpy as np
import pytest

from corellm.model.gguf_reader import GGUFContents
from corellm.model.loader import default_model_path

gguf = pytest.importorskip("gguf")


def assert_same(path):
    ours, ref = GGUFContents(path), gguf.GGUFReader(str(path))
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert sorted(keys) == sorted(ours.fields)
    for key in keys:
        want, got = ref.fields[key].contents(), ours.fields[key]
        if isinstance(want, list) and want and isinstance(want[0], float):
            np.testing.assert_array_equal(np.asarray(got, dtype=np.float32), np.asarray(want, dtype=np.float32))
        else:
            assert got == want, key
    assert len(ours.tensors) == len(ref.tensors)
    for a, b in zip(ours.tensors, ref.tensors):
        assert (a.name, a.tensor_type, a.shape) == (b.name, b.tensor_type, [int(d) for d in b.shape])
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name


def test_the_default_model_reads_as_the_gguf_package_reads_it():
    assert_same(default_model_path())


def test_every_kind_of_value_and_tensor(tmp_path):
    path = tmp_path / "kinds.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("k.u8", 7)
    w.add_int16("k.i16", -300)
    w.add_uint32("k.u32", 4_000_000_000)
    w.add_int64("k.i64", -(2**40))
    w.add_float64("k.f64", 0.1)
    w.add_bool("k.bool", True)
    w.add_string("k.str", "héllo ▁world")
    w.add_array("k.strs", ["a", "", "ünï", "<end_of_turn>"])
    w.add_array("k.ints", [1, -2, 3])
    w.add_array("k.floats", [0.5, -1.25])
    w.add_array("k.bools", [True, False, True])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 8)).astype(np.float16))
    w.add_tensor("q8", gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32),
                                            gguf.GGMLQuantizationType.Q8_0), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("vec", rng.standard_normal(7).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same(path)
    assert GGUFContents(path).fields["k.strs"] == ["a", "", "ünï", "<end_of_turn>"]


def test_not_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GGUFContents(path)
