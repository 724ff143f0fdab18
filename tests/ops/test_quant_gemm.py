"""The quantized GEMM (cpp/include/corellm/kernels/quant_gemm.h) on every GGUF type it takes:
packing keeps the file's values (dequantized rows equal the `gguf` package's), every path gives
the same bits, each row's result is independent of the batch, and the result is within the
bound that activation quantization implies of a float64 product with the dequantized weights.

Bound: x is quantized per block a of 32 values to d_a q with |x - d_a q| <= d_a / 2, so
|y - x W^T| <= sum_a (d_a / 2) sum_{e in a} |w_e|, plus fp32 rounding (1e-5 of sum |x| |w|)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm.model.quantized_tensor import QuantizedTensor
from corellm.native import _core
from tests.quant_blocks import ALL_TYPES, K_TYPES, dequantize, quantize

gguf = pytest.importorskip("gguf")
K = _core.kernels
PATHS = ["reference", "avx2"] + {"amx": ["avx512vnni", "amx"], "avx512vnni": ["avx512vnni"]}.get(K.quant_path(), [])
DTYPES = {torch.float32: K.DTYPE_F32, torch.bfloat16: K.DTYPE_BF16}


def ggml_type(name: str) -> int:
    return int(getattr(gguf.GGMLQuantizationType, name))


def weight(type_name: str, n: int, k: int, seed: int = 0) -> tuple[QuantizedTensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    blocks = quantize(w, type_name)
    return QuantizedTensor.pack(ggml_type(type_name), blocks, (n, k)), dequantize(blocks, type_name)


def gemm(q: QuantizedTensor, x: torch.Tensor, out_dtype=torch.float32, path: str = "", bias=None) -> torch.Tensor:
    n, k = q.shape
    y = torch.empty((x.shape[0], n), dtype=out_dtype)
    K.quant_gemm(x.data_ptr(), x.stride(0), DTYPES[x.dtype], q.ggml_type, q.packed.data_ptr(),
                 0 if bias is None else bias.data_ptr(), y.data_ptr(), n, DTYPES[out_dtype], x.shape[0], n, k, path)
    return y


def activation_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """[m, n]: sum over blocks of d_a / 2 times the block's sum of |w|, plus fp32 rounding."""
    m, k = x.shape
    d = np.abs(x.reshape(m, k // 32, 32)).max(-1) / 127  # [m, blocks]
    wsum = np.abs(w).reshape(w.shape[0], k // 32, 32).sum(-1)  # [n, blocks]
    return (d / 2) @ wsum.T * (1 + 1e-5) + 1e-5 * (np.abs(x) @ np.abs(w).T) + 1e-6


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_packing_keeps_the_values(type_name):
    n, k = 40, 512
    q, w = weight(type_name, n, k)
    ids = torch.tensor([0, 39, 17, 16, 15, 3], dtype=torch.int32)
    rows = q.dequantize_rows(ids, torch.float32)
    np.testing.assert_allclose(rows.numpy(), w[ids.numpy()], rtol=1e-6, atol=1e-7)
    assert q.nbytes == K.quant_gemm_packed_size(q.ggml_type, n, k)


def paths_agree_within_bound(q: QuantizedTensor, x: torch.Tensor, w: np.ndarray) -> dict[str, torch.Tensor]:
    """Every path's y for x (fp32): each the reference path's bits, the reference within the
    activation bound of the float64 product with the dequantized weight w."""
    got = {path: gemm(q, x, path=path) for path in PATHS}
    for path in PATHS[1:]:
        assert torch.equal(got[path], got["reference"]), f"{path} differs from the reference path"
    err = np.abs(got["reference"].double().numpy() - x.double().numpy() @ w.astype(np.float64).T)
    bound = activation_bound(x.numpy(), w)
    assert (err <= bound).all(), f"worst error {err.max():.3g}, bound there {bound.flat[err.argmax()]:.3g}"
    return got


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_paths_agree_and_are_within_the_activation_bound(type_name):
    n, k, m = 40, 512, 37  # the amx path: two tiles of 16 rows, 5 rows on the vector loops
    q, w = weight(type_name, n, k, seed=1)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(2))
    paths_agree_within_bound(q, x, w)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_an_odd_number_of_blocks_per_row(type_name):
    """k = 3 blocks of 32 (the amx path's tiles of 16 rows, then 3 rows on the vector loops):
    every path is the reference's bits, within the bound, and each row is its bits alone."""
    n, k, m = 24, 96, 35
    q, w = weight(type_name, n, k, seed=9)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(10))
    got = paths_agree_within_bound(q, x, w)
    for r in (0, 17, 34):
        assert torch.equal(gemm(q, x[r : r + 1])[0], got[PATHS[-1]][r]), f"row {r} depends on the batch"


@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_K", "Q6_K"])
def test_many_rows_share_every_panel_once(type_name):
    """Rows in several chunks of 128 (each chunk's panels shared by the team, taken one at a time
    and from the other thread's back: quant_gemm.cpp), an odd number of panels: every path is the
    reference's bits and within the bound, and each row is its bits alone."""
    n, k, m = 200, 256, 300  # 13 panels of 16; chunks of 128, 128 and 44 rows (amx: a 12-row tail)
    q, w = weight(type_name, n, k, seed=7)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(8))
    got = paths_agree_within_bound(q, x, w)
    for r in (0, 127, 128, 299):
        assert torch.equal(gemm(q, x[r : r + 1])[0], got[PATHS[-1]][r]), f"row {r} depends on the batch"


# A block's bytes, and where its fp16 scales lie, for the types a min/max rule leaves partly
# unexercised (16-value sub-blocks, level lookups).
SCALE_BYTES = {"Q2_K": (84, [80, 82]), "Q3_K": (110, [108]), "IQ4_NL": (18, [0]), "IQ4_XS": (136, [0])}


@pytest.mark.parametrize("type_name", sorted(SCALE_BYTES))
def test_types_on_arbitrary_bits(type_name):
    """Blocks of random bytes (every scale, min and value bit pattern; the fp16 scales finite):
    packing keeps the values the `gguf` package dequantizes, and every path is the reference's
    bits, within the activation bound."""
    (size, scales), (n, k, m) = SCALE_BYTES[type_name], (33, 512, 19)
    per_row = k // (32 if type_name == "IQ4_NL" else 256)
    rng = np.random.default_rng(11)
    blocks = rng.integers(0, 256, size=(n, per_row, size), dtype=np.uint8)
    for at in scales:
        blocks[:, :, at : at + 2] = rng.uniform(-0.01, 0.01, (n, per_row)).astype(np.float16).view(np.uint8).reshape(
            n, per_row, 2)
    blocks = blocks.reshape(n, -1)
    q = QuantizedTensor.pack(ggml_type(type_name), blocks, (n, k))
    w = dequantize(blocks, type_name)
    np.testing.assert_allclose(q.dequantize(torch.float32).numpy(), w, rtol=1e-6, atol=1e-7)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(12))
    paths_agree_within_bound(q, x, w)


def test_mxfp4_keeps_every_scale_byte():
    """MXFP4's E8M0 scale 2^(e - 128) for every byte e (2^-128 and 2^-127 subnormal in fp32 and bf16
    alike, 2^127 the largest), kept in the panel as bf16: each row dequantizes to the `gguf`
    package's values exactly; and rows of moderate scales multiply as the reference does."""
    rng = np.random.default_rng(13)
    blocks = np.concatenate([np.arange(256, dtype=np.uint8)[:, None],
                             rng.integers(0, 256, size=(256, 16), dtype=np.uint8)], axis=1)
    q = QuantizedTensor.pack(ggml_type("MXFP4"), blocks, (256, 32))
    with np.errstate(over="ignore"):  # 2^127 x 12 is infinite in fp32, for both
        want = dequantize(blocks, "MXFP4")
    np.testing.assert_array_equal(q.dequantize(torch.float32).numpy(), want)
    moderate = blocks[100:150]  # scales 2^-28 .. 2^21
    q = QuantizedTensor.pack(ggml_type("MXFP4"), moderate, (50, 32))
    x = torch.randn(20, 32, generator=torch.Generator().manual_seed(14))
    paths_agree_within_bound(q, x, dequantize(moderate, "MXFP4"))


@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0", "Q6_K", "Q5_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_each_row_is_independent_of_the_batch(type_name, x_dtype):
    n, k, m = 48, 512, 11
    q, _ = weight(type_name, n, k, seed=3)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(4)).to(x_dtype)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    for out in (torch.float32, torch.bfloat16):
        batch = gemm(q, x, out, bias=bias)
        for r in (0, 4, 10):
            alone = gemm(q, x[r : r + 1], out, bias=bias)
            assert torch.equal(alone[0], batch[r]), f"row {r} ({out}) depends on the batch"
        # The bias is added before the one rounding.
        expected = (gemm(q, x, torch.float32) + bias.float()).to(out)
        assert torch.equal(batch, expected)


def test_a_strided_x_and_a_column_slice_of_y():
    q, w = weight("Q4_0", 32, 256, seed=6)
    wide = torch.randn(5, 300)
    x = wide[:, 10:266]  # row stride 300
    y = torch.zeros(5, 50)
    q.matmul_into(x, y[:, 9:41])
    assert torch.equal(y[:, 9:41], gemm(q, x.contiguous()))
    assert (y[:, :9] == 0).all() and (y[:, 41:] == 0).all()


def test_k_types_need_whole_super_blocks_and_unknown_types_are_named():
    blocks = quantize(np.zeros((16, 256), np.float32), "Q4_K")
    with pytest.raises(ValueError, match="Q4_K weight needs n >= 1 and k a multiple of 256"):
        K.quant_gemm_packed_size(ggml_type("Q4_K"), 16, 320)
    with pytest.raises(ValueError, match="ggml type 1 has no quantized kernel"):
        K.quant_gemm_packed_size(1, 16, 256)
    with pytest.raises(ValueError, match="expected 16 rows of 144 bytes"):
        QuantizedTensor.pack(ggml_type("Q4_K"), blocks[:, :100], (16, 256))
    assert set(K_TYPES) <= set(ALL_TYPES)


def test_an_embedding_id_outside_the_table_is_named():
    q, _ = weight("Q8_0", 16, 64)
    with pytest.raises(ValueError, match="token id 16 is outside the vocabulary"):
        q.dequantize_rows(torch.tensor([3, 16], dtype=torch.int32), torch.float32)


def test_row_order_undoes_a_permutation():
    n, k = 32, 128
    rng = np.random.default_rng(7)
    w = rng.standard_normal((n, k)).astype(np.float32)
    blocks = quantize(w, "Q5_1")
    order = rng.permutation(n).astype(np.int32)
    q = QuantizedTensor.pack(ggml_type("Q5_1"), blocks, (n, k), order)
    np.testing.assert_array_equal(q.dequantize(torch.float32).numpy(), dequantize(blocks, "Q5_1")[order])
