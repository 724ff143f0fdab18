"""corellm's bf16 GEMM over a panel-packed weight against torch (float64), on every instruction-set
path this CPU runs (avx2, avx512, avx512bf16, amx): shapes with and without a 32-column panel tail, an odd k
and a k that is not a multiple of 32, with and without bias, 1 to 300 rows (every register-block
and tile remainder, more than one 128-row chunk), strided x and y; each row's result independent
of the batch on each path; CORELLM_ISA forces a path, and a path the CPU lacks is refused."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from corellm import _core

k = _core.kernels
pytestmark = pytest.mark.skipif(not k.bf16_gemm_available(), reason="needs AVX2 and FMA")
ISAS = k.supported_cpu_isas() or ["avx2"]  # (skipped when empty)


def pack(w: torch.Tensor) -> torch.Tensor:
    n, kk = w.shape
    packed = torch.full((k.bf16_gemm_packed_size(n, kk),), float("nan"), dtype=torch.bfloat16)
    k.bf16_gemm_pack(w.data_ptr(), packed.data_ptr(), n, kk)
    return packed


def gemm(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None = None,
         y: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16, isa: str = "") -> torch.Tensor:
    m, kk = x.shape
    if y is None:
        y = torch.empty(m, n, dtype=out_dtype)
    tag = k.DTYPE_F32 if y.dtype == torch.float32 else k.DTYPE_BF16
    k.bf16_gemm(x.data_ptr(), x.stride(0), packed.data_ptr(), 0 if bias is None else bias.data_ptr(), y.data_ptr(),
                y.stride(0), m, n, kk, tag, isa=isa)
    return y


def test_pack_layout():
    """Panels of 32 output columns; per pair of input columns, the panel's 32 (k, k+1) pairs side
    by side; zero padding to whole panels and to k a multiple of 32."""
    n, kk = 40, 7
    w = torch.arange(n * kk, dtype=torch.float32).view(n, kk).bfloat16()
    p = pack(w).view(2, 16, 32, 2)  # panels, k pairs, columns, pair
    padded = torch.zeros(64, 32, dtype=torch.bfloat16)
    padded[:n, :kk] = w
    assert torch.equal(p, padded.view(2, 32, 16, 2).permute(0, 2, 1, 3))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 23, 32, 33, 64, 129, 300])
@pytest.mark.parametrize("n, kk", [(960, 576), (37, 70), (5, 31), (1000, 1536), (3, 1), (32, 2), (33, 3), (48, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_matches_torch(m, n, kk, bias, isa):
    g = torch.Generator().manual_seed(n * kk + m)
    x = torch.randn(m, kk, generator=g).bfloat16()
    w = torch.randn(n, kk, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    packed = pack(w)  # held: a temporary's memory could be reused before the kernel reads it
    y = gemm(x, packed, n, b, isa=isa)
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(y.double(), want, atol=0.05 * want.abs().max().item() / 8, rtol=1e-2)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m", [1, 5, 130])
def test_float32_output_is_the_unrounded_sum(m, isa):
    g = torch.Generator().manual_seed(m)
    n, kk = 77, 130
    x, w = torch.randn(m, kk, generator=g).bfloat16(), torch.randn(n, kk, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16()
    packed = pack(w)
    y32 = gemm(x, packed, n, b, out_dtype=torch.float32, isa=isa)
    want = torch.nn.functional.linear(x.double(), w.double(), b.double())
    torch.testing.assert_close(y32.double(), want, atol=1e-4, rtol=1e-4)  # fp32 accumulation error only
    assert torch.equal(y32.bfloat16(), gemm(x, packed, n, b, isa=isa))  # the bf16 output is its rounding


@pytest.mark.parametrize("isa", ISAS)
def test_float32_output_without_bias_into_a_strided_y(isa):
    """Logits: fp32 without a bias, which the amx path stores from its tiles straight into y
    (whole 16-row tiles of whole panels; the rest through its buffer)."""
    g = torch.Generator().manual_seed(3)
    m, n, kk = 130, 100, 64
    x, w = torch.randn(m, kk, generator=g).bfloat16(), torch.randn(n, kk, generator=g).bfloat16()
    packed = pack(w)
    y_wide = torch.full((m, n + 6), 7.0)
    gemm(x, packed, n, y=y_wide[:, :n], isa=isa)
    assert (y_wide[:, n:] == 7.0).all()  # nothing written past the row
    want = torch.nn.functional.linear(x.double(), w.double())
    torch.testing.assert_close(y_wide[:, :n].double(), want, atol=1e-4, rtol=1e-4)
    for i in (0, 15, 16, 127, 129):  # alone (through the buffer): the same sums
        assert torch.equal(gemm(x[i : i + 1], packed, n, out_dtype=torch.float32, isa=isa)[0], y_wide[i, :n])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kk", [96, 97, 100])  # tiles read x in place, or from the padded copy; an odd k
def test_rows_are_independent_of_the_batch_and_strides_are_honoured(isa, kk):
    g = torch.Generator().manual_seed(0)
    n = 100
    w = torch.randn(n, kk, generator=g).bfloat16()
    packed = pack(w)
    x_wide = torch.randn(300, kk + 10, generator=g).bfloat16()
    x = x_wide[:, 3 : 3 + kk]  # row stride kk + 10
    y_wide = torch.zeros(300, n + 6, dtype=torch.bfloat16)
    gemm(x, packed, n, y=y_wide[:, :n], isa=isa)
    assert (y_wide[:, n:] == 0).all()  # nothing written past the row
    for i in (0, 7, 8, 15, 16, 31, 39, 130, 299):
        assert torch.equal(gemm(x[i : i + 1].contiguous(), packed, n, isa=isa)[0], y_wide[i, :n])
    for m in (4, 5, 17, 40, 47, 48, 129):  # other batch sizes (each avx2 way: 1-3, 4-47, 48+ rows): the same rows
        assert torch.equal(gemm(x[:m], packed, n, isa=isa), y_wide[:m, :n])


def test_zero_rows_do_nothing_and_bad_shapes_are_refused():
    w = torch.zeros(8, 32, dtype=torch.bfloat16)
    packed = pack(w)
    x = torch.zeros(1, 32, dtype=torch.bfloat16)
    k.bf16_gemm(x.data_ptr(), 32, packed.data_ptr(), 0, x.data_ptr(), 8, 0, 8, 32)
    with pytest.raises(ValueError, match="bad shape"):
        k.bf16_gemm(x.data_ptr(), 32, packed.data_ptr(), 0, x.data_ptr(), 8, -1, 8, 32)


def _cpu_isa_with(env_value: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CORELLM_ISA=env_value)
    return subprocess.run([sys.executable, "-c", "from corellm import _core; print(_core.kernels.cpu_isa())"],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("isa", ISAS)
def test_corellm_isa_forces_a_path_the_cpu_runs(isa):
    assert _cpu_isa_with(isa).stdout.strip() == isa
    assert k.cpu_isa() == ISAS[-1] or os.environ.get("CORELLM_ISA")  # unforced: the best


def test_an_unknown_or_unsupported_path_is_refused_naming_it():
    bad = _cpu_isa_with("sse2")
    assert bad.returncode != 0 and "CORELLM_ISA=sse2: unknown instruction-set path" in bad.stderr
    with pytest.raises(ValueError, match="unknown instruction-set path 'sse2'"):
        x = torch.zeros(1, 32, dtype=torch.bfloat16)
        k.bf16_gemm(x.data_ptr(), 32, pack(torch.zeros(8, 32, dtype=torch.bfloat16)).data_ptr(), 0,
                    x.data_ptr(), 8, 1, 8, 32, isa="sse2")
    missing = [isa for isa in ("avx2", "avx512", "avx512bf16", "amx") if isa not in k.supported_cpu_isas()]
    for isa in missing:
        refused = _cpu_isa_with(isa)
        assert refused.returncode != 0 and f"CORELLM_ISA={isa}: this CPU" in refused.stderr
        with pytest.raises(ValueError, match=f"cannot run the {isa} path"):
            x = torch.zeros(1, 32, dtype=torch.bfloat16)
            k.bf16_gemm(x.data_ptr(), 32, pack(torch.zeros(8, 32, dtype=torch.bfloat16)).data_ptr(), 0,
                        x.data_ptr(), 8, 1, 8, 32, isa=isa)


def test_an_engine_with_a_path_the_cpu_cannot_run_fails_before_loading():
    env = dict(os.environ, CORELLM_ISA="sse2")
    run = subprocess.run([sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO)\n"
                          "from corellm import LLM; LLM()"], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "CORELLM_ISA=sse2: unknown instruction-set path" in run.stderr
    assert "KV cache" not in run.stderr  # nothing was loaded or allocated


def view_at_line_offset(x: torch.Tensor, stride: int, byte_offset: int) -> torch.Tensor:
    """A copy of x whose first row starts `byte_offset` bytes past a 64-byte line, rows `stride` apart."""
    m, kk = x.shape
    storage = torch.zeros(m * stride + 64, dtype=x.dtype)
    start = (-storage.data_ptr() // 2) % 32 + byte_offset // 2
    view = storage[start : start + m * stride].view(m, stride)[:, :kk]
    view.copy_(x)
    assert view.data_ptr() % 64 == byte_offset
    return view


@pytest.mark.parametrize("isa", ISAS)
def test_x_read_in_place_or_copied_gives_the_same_rows_over_several_row_chunks(isa):
    """The amx path reads x's tiles in place when its rows start on 64-byte lines and k is a whole
    number of 32-column groups, and copies them otherwise (and the last, partial row tile); the
    rows are cut into equal chunks of up to 768 KiB of x. Every way gives the same bits, row by row."""
    g = torch.Generator().manual_seed(5)
    m, n, kk = 1500, 96, 576  # three chunks of 512 rows (the last one short), and a partial row tile
    w = torch.randn(n, kk, generator=g).bfloat16()
    packed = pack(w)
    x = torch.randn(m, kk, generator=g).bfloat16()
    in_place = view_at_line_offset(x, kk + 64, 0)  # row stride 1280 bytes: every row on a line
    y = gemm(in_place, packed, n, isa=isa)
    want = torch.nn.functional.linear(x.double(), w.double())
    torch.testing.assert_close(y.double(), want, atol=0.05 * want.abs().max().item() / 8, rtol=1e-2)
    assert torch.equal(gemm(view_at_line_offset(x, kk + 64, 2), packed, n, isa=isa), y)  # copied
    assert torch.equal(gemm(view_at_line_offset(x, kk + 8, 0), packed, n, isa=isa), y)  # rows off the lines
    for i in (0, 511, 512, 1023, 1024, 1487, 1499):
        assert torch.equal(gemm(x[i : i + 1].contiguous(), packed, n, isa=isa)[0], y[i])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_a_y_larger_than_the_caches_gets_the_same_rows(isa, out_dtype):
    """From 4 MiB of y per thread, where its rows start on 64-byte lines, the amx path writes y's
    lines past the caches (non-temporal stores; an fp32 y's tiles no longer stored in place): the
    same bits as the rows computed alone and as a y off the lines (stored the usual way), with a
    ragged last panel (stored the usual way) and nothing written past a row's n columns."""
    g = torch.Generator().manual_seed(6)
    m, n, kk = 520, 8200, 64  # y 17 MB in fp32, 8.5 MB in bf16: streamed by up to 4 / 2 threads
    w = torch.randn(n, kk, generator=g).bfloat16()
    packed = pack(w)
    x = torch.randn(m, kk, generator=g).bfloat16()
    y_wide = torch.zeros(m, n + 24, dtype=out_dtype)  # row stride 8224: every row on a line
    y = gemm(x, packed, n, y=y_wide[:, :n], isa=isa)
    assert (y_wide[:, n:] == 0).all()
    want = torch.nn.functional.linear(x.double(), w.double())
    torch.testing.assert_close(y.double(), want, atol=0.05 * want.abs().max().item() / 8, rtol=1e-2)
    for i in (0, 31, 32, 519):
        assert torch.equal(gemm(x[i : i + 1].contiguous(), packed, n, out_dtype=out_dtype, isa=isa)[0], y[i])
    assert torch.equal(gemm(x, packed, n, out_dtype=out_dtype, isa=isa), y)  # row stride 8200: off the lines


def gelu_gemm(x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None, isa: str = "amx",
              y: torch.Tensor | None = None) -> torch.Tensor:
    m, kk = x.shape
    y = torch.empty(m, n, dtype=torch.bfloat16) if y is None else y
    k.bf16_gemm_gelu(x.data_ptr(), x.stride(0), packed.data_ptr(), 0 if bias is None else bias.data_ptr(),
                     y.data_ptr(), y.stride(0), m, n, kk, isa=isa)
    return y


@pytest.mark.skipif("amx" not in ISAS, reason="the fused GELU store is the amx path's")
@pytest.mark.parametrize("m", [1, 5, 17, 33, 129, 300])
@pytest.mark.parametrize("n, kk", [(1536, 384), (40, 70), (96, 32)])
@pytest.mark.parametrize("bias", [False, True])
def test_gelu_in_the_store_is_the_gemm_then_gelu(m, n, kk, bias):
    """bf16_gemm_gelu = gelu (erf form) of bf16_gemm's bf16 y, rounded again: against float64's exact
    GELU of those same values, at most one bf16 step apart (erf within 1.5e-7 can tip a rounding), or
    1e-6 in GELU's negative tail (below about -4, where 1 - erf is itself of the order of erf's
    error: float32's exact erf loses as much there), nearly all equal; with a panel tail (n = 40) and
    the store's masked halves; each row the same alone and in the batch."""
    g = torch.Generator().manual_seed(n * kk + m)
    x = (torch.randn(m, kk, generator=g) * 0.5).bfloat16()
    w = (torch.randn(n, kk, generator=g) / kk**0.5 * 3).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    packed = pack(w)
    got = gelu_gemm(x, packed, n, b)
    want = torch.nn.functional.gelu(gemm(x, packed, n, b, isa="amx").double()).bfloat16()
    step = (want.float().abs() * 2**-7).clamp_min(1e-6)  # a bf16 step (2^-8 relative, doubled at the edges)
    assert ((got.float() - want.float()).abs() <= step).all()
    assert (got == want).float().mean() > 0.9  # (about 1 % differ in a large sample)
    rows = [0, m - 1]
    for r in rows:
        assert torch.equal(gelu_gemm(x[r:r + 1], packed, n, b)[0], got[r])


def test_the_fused_gelu_store_is_refused_where_the_path_has_none():
    x, w = torch.randn(2, 64).bfloat16(), torch.randn(32, 64).bfloat16()
    for isa in ISAS:
        if isa != "amx":
            assert not k.bf16_gemm_gelu_fused(isa)
            with pytest.raises(ValueError, match=f"bf16_gemm_gelu: no fused pass on the {isa} path"):
                gelu_gemm(x, pack(w), 32, None, isa=isa)
