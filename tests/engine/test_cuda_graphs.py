"""CUDA graphs for decode (python/corellm/worker/cuda_graphs.py): the capture sizes and the
dispatch rule here; on a GPU, replay equals eager bit for bit at a captured size, padded batches
agree with eager, the engine's outputs are the same with and without graphs, and enforce_eager
captures nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm import SamplingParams
from corellm.model.attention_metadata import AttentionMetadata
from corellm.ops._backend import cuda_available
from corellm.worker.cuda_graphs import CUDAGraphRunner, capture_sizes
from tests.engine.test_cuda_engine import cuda_llm, first_near_tie, tiny_dir  # noqa: F401 - the fixture

needs_gpu = pytest.mark.skipif(not (cuda_available() and torch.cuda.is_available()),
                               reason="needs corellm._cuda and a CUDA GPU")


def test_capture_sizes():
    assert capture_sizes(1) == [1]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(50) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 50]


def test_dispatch_pads_uniform_decode_only():
    runner = CUDAGraphRunner.__new__(CUDAGraphRunner)  # the rule alone: no buffers, no GPU
    runner.sizes = capture_sizes(64)
    runner.graphs = {s: None for s in runner.sizes}
    assert runner.dispatch(1, 1) == 1
    assert runner.dispatch(3, 3) == 4
    assert runner.dispatch(17, 17) == 24
    assert runner.dispatch(64, 64) == 64
    assert runner.dispatch(65, 65) is None  # beyond the largest capture
    assert runner.dispatch(4, 9) is None  # a prefill in the batch: eager
    assert runner.dispatch(0, 0) is None


def decode_batch(n: int, block_size: int, num_blocks: int, seed: int):
    """A decode batch of n rows over distinct blocks: (ids, positions, slots, block table, seq lens)."""
    g = np.random.default_rng(seed)
    width = 4
    table = g.permutation(num_blocks)[: n * width].reshape(n, width).astype(np.int32)
    seq_lens = g.integers(1, width * block_size + 1, n).astype(np.int32)
    positions = (seq_lens - 1).astype(np.int32)
    slots = (table[np.arange(n), positions // block_size] * block_size + positions % block_size).astype(np.int32)
    ids = g.integers(0, 384, n).astype(np.int32)
    return ids, positions, slots, table, seq_lens


def eager_forward(runner, batch):
    ids, positions, slots, table, seq_lens = batch
    dev = runner.device
    t = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
    n = ids.shape[0]
    attn = AttentionMetadata(slot_mapping=t(slots), block_table=t(table), seq_lens=t(seq_lens),
                             query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=dev), max_query_len=1)
    with torch.inference_mode():
        return runner.model.forward(t(ids), t(positions), attn, runner.kv_caches)


@needs_gpu
def test_replay_equals_eager(tiny_dir):  # noqa: F811
    llm = cuda_llm(tiny_dir)
    graphs = llm.engine_core.model_runner.cuda_graphs
    assert graphs is not None and sorted(graphs.graphs) == capture_sizes(16)
    bs, nb = llm.engine_core.scheduler_config.block_size, llm.engine_core.scheduler_config.num_blocks
    batch = decode_batch(8, bs, nb, seed=1)
    want = eager_forward(graphs, batch).clone()
    with torch.inference_mode():
        got = graphs.run(8, *batch).clone()
    # Bit-equal by construction: replay runs the kernels captured for 8 rows in their launch order,
    # and the eager call launches the same ones on the same shapes and inputs (fp32: the scalar
    # attention kernel, whose grid does not depend on max_seq_len; cuBLAS picks by shape).
    assert torch.equal(got, want)
    small = decode_batch(5, bs, nb, seed=2)  # padded to 8
    want = eager_forward(graphs, small).clone()
    with torch.inference_mode():
        got = graphs.run(graphs.dispatch(5, 5), *small).clone()
    # Padded to 8 rows, the GEMMs run another shape than eager's 5 (cuBLAS may tile and sum
    # differently): equal within fp32 rounding, not bit for bit.
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@needs_gpu
def test_engine_outputs_with_and_without_graphs(tiny_dir):  # noqa: F811
    g = torch.Generator().manual_seed(3)
    prompts = [{"prompt_token_ids": torch.randint(0, 384, (n,), generator=g).tolist()} for n in (5, 17, 40, 3, 9)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    eager = cuda_llm(tiny_dir, enforce_eager=True)
    assert eager.engine_core.model_runner.cuda_graphs is None
    graphs = cuda_llm(tiny_dir)
    want = eager.generate(prompts, params, use_tqdm=False)
    got = graphs.generate(prompts, params, use_tqdm=False)
    for w, o in zip(want, got):
        n = first_near_tie(w.outputs[0].logprobs)
        assert o.outputs[0].token_ids[:n] == w.outputs[0].token_ids[:n]
    graphs.shutdown()
    assert graphs.engine_core.model_runner.cuda_graphs is None
