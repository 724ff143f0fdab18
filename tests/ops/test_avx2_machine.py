"""The build runs on a CPU without AVX-512: every CPU kernel is run in a process emulating one
(QEMU's user mode, whose CPU has AVX2 and FMA but no AVX-512, BF16 or AMX), and gives bit for bit
what the same kernels give here under CORELLM_ISA=avx2. An AVX-512 or AMX instruction reached on
that machine is an illegal instruction there (test_portable_build.py finds them in the objects;
this finds what that reading could miss). The whole engine was checked the same way by hand
(README, "CPU instruction-set paths"): under emulation it takes minutes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
QEMU = shutil.which("qemu-x86_64")
pytestmark = pytest.mark.skipif(QEMU is None, reason="needs qemu-user (apt-get install qemu-user; make test does)")

# Each op on its avx2 path: the GEMM (row blocks and tails, bias, fp32 out), attention on bf16 and
# fp32 caches (decode and prefill rows, a window), the norms, SwiGLU, rotary and the sampler.
KERNELS = r"""
import sys, torch
from corellm import ops
from corellm.native import _core
from tests.ops.test_attention import make_batch
from tests.ops.test_packed_gemm import gemm, pack
k = _core.kernels
g = torch.Generator().manual_seed(0)
out = {"isas": k.supported_cpu_isas(), "path": k.cpu_isa()}
w, b = torch.randn(70, 100, generator=g).bfloat16(), torch.randn(70, generator=g).bfloat16()
packed = pack(w)
for m in (1, 3, 130):
    x = torch.randn(m, 100, generator=g).bfloat16()
    out[f"gemm{m}"] = gemm(x, packed, 70, b)
    out[f"gemm{m}_f32"] = gemm(x, packed, 70, b, out_dtype=torch.float32)
for dtype in (torch.bfloat16, torch.float32):
    kc, vc, table, seq_lens, qsl = make_batch([(40, 1), (70, 20), (33, 33)], 3, 64, 16, dtype, seed=1)
    q = torch.randn(int(qsl[-1]), 9 * 64, generator=g).to(dtype)
    out[f"attention_{dtype}"] = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125)
    out[f"window_{dtype}"] = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, sliding_window=9)
    x, r = torch.randn(17, 576, generator=g).to(dtype), torch.randn(17, 576, generator=g).to(dtype)
    nw = torch.randn(576, generator=g).to(dtype)
    out[f"rms_norm_{dtype}"] = ops.rms_norm(x, nw, 1e-5)
    out[f"fused_{dtype}"] = ops.fused_add_rms_norm(x.clone(), r.clone(), nw, 1e-5)
    out[f"silu_{dtype}"] = ops.silu_and_mul(torch.randn(17, 2 * 1536, generator=g).to(dtype))
    out[f"gelu_{dtype}"] = ops.gelu_tanh_and_mul(torch.randn(17, 2 * 2048, generator=g).to(dtype))
    qr, kr = torch.randn(17, 9 * 64, generator=g).to(dtype), torch.randn(17, 3 * 64, generator=g).to(dtype)
    cache = torch.randn(128, 64, generator=g)
    ops.rotary_embedding(torch.arange(17, dtype=torch.int32) * 3, qr, kr, 64, cache)
    out[f"rotary_{dtype}"] = (qr, kr)
logits = torch.randn(4, 49152, generator=g)
md = ops.SamplingMetadata(temperature=torch.tensor([0.0, 0.8, 1.0, 0.7]), seeds=torch.arange(4, dtype=torch.int64),
                          steps=torch.zeros(4, dtype=torch.int64), top_p=torch.tensor([1.0, 0.9, 1.0, 0.5]),
                          num_logprobs=3)
sampled = ops.sample(logits, md)
out["sample"] = [getattr(sampled, f) for f in sorted(vars(sampled)) if isinstance(getattr(sampled, f), torch.Tensor)]
torch.save(out, sys.argv[1])
"""


def _run(command: list[str], result: str, **env) -> dict:
    run = subprocess.run(command + ["-c", KERNELS, result], env=dict(os.environ, **env), capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    return torch.load(result)


def _assert_identical(a, b, name):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{name} differs between the AVX2 machine and the avx2 path here"
    elif isinstance(a, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_identical(x, y, f"{name}[{i}]")
    else:
        assert a == b, f"{name}: {a} != {b}"


def test_the_kernels_run_on_an_avx2_machine_as_the_avx2_path_does_here(tmp_path):
    emulated = _run([QEMU, "-cpu", "max", sys.executable], str(tmp_path / "emulated.pt"))
    assert emulated["isas"] == ["avx2"] and emulated["path"] == "avx2"  # the emulated CPU has no AVX-512
    here = _run([sys.executable], str(tmp_path / "here.pt"), CORELLM_ISA="avx2")
    assert here["path"] == "avx2"
    for name in emulated:
        if name not in ("isas", "path"):
            _assert_identical(emulated[name], here[name], name)
