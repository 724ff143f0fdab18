"""A tensor-parallel model (model/tensor_parallel.py) in processes joined over gloo on loopback:
every rank loads its share of a tiny random model, the ranks run the same steps, and rank 0's
logits equal the single-process model's (fp32; the all-reduces change the order of summation,
hence a tolerance), with the all-reduces through shared memory (ranks on one machine) or gloo.
Heads that do not divide are a ValueError naming them."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("transformers")

from tests.model.runner import PagedRunner  # noqa: E402
from tests.model.tiny_models import make_tiny_model  # noqa: E402

PROMPTS = [[5, 17, 40, 41, 3, 99, 250], [7, 8, 9], [300, 12, 44, 45, 46, 47, 48, 49, 50, 51, 52]]
STEPS = [[60, 61, 62], [63, 64, 65]]  # fixed decode tokens: every rank feeds the same


def run_steps(model) -> list[torch.Tensor]:
    runner = PagedRunner(model, 64, len(PROMPTS), block_size=8, seed=2)
    out = [runner.step(PROMPTS)]
    for tokens in STEPS:
        out.append(runner.step([[t] for t in tokens]))
    return out


def rank_main(rank: int, size: int, init: str, directory: str, single_machine: bool, results) -> None:
    from corellm.distributed.parallel_state import init_tensor_parallel
    from corellm.model.loader import load_model

    torch.set_num_threads(1)
    tp = init_tensor_parallel(rank, size, init, torch.device("cpu"), shm_all_reduce=single_machine)
    assert (tp.shm_all_reduce is not None) == single_machine
    model = load_model(directory, dtype="float32", progress=False, tensor_parallel=tp).model
    with torch.inference_mode():
        logits = run_steps(model)
    if rank == 0:
        # numpy arrays pickle by value; a torch tensor on an mp queue is shared through a file
        # descriptor the parent fetches from this process later, which fails if this one exited first
        results.put([t.numpy().copy() for t in logits])
    else:
        assert all(t is None for t in logits)
    torch.distributed.destroy_process_group()


def run_tensor_parallel(directory, size: int, single_machine: bool) -> list[torch.Tensor]:
    from corellm.worker.tp_workers import free_local_port

    context = mp.get_context("spawn")
    results = context.Queue()
    init = f"tcp://127.0.0.1:{free_local_port()}"
    processes = [context.Process(target=rank_main, args=(r, size, init, str(directory), single_machine, results)) for r in range(size)]
    for p in processes:
        p.start()
    logits = [torch.from_numpy(a) for a in results.get(timeout=120)]
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0
    return logits


@pytest.mark.parametrize("arch, size, overrides, single_machine", [
    ("llama3", 3, dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=192), True),
    ("llama3", 3, dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=192), False),
    ("qwen2", 2, dict(num_attention_heads=4, num_key_value_heads=1), True),  # one KV head, replicated
    ("qwen3", 2, dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=383), True),  # vocabulary padded
    ("llama_tied", 4, dict(num_attention_heads=4, num_key_value_heads=4), True),
])
def test_rank_zero_logits_equal_the_single_process_model(tmp_path, tokenizer_json, arch, size, overrides,
                                                         single_machine):
    from corellm.model.loader import load_model

    make_tiny_model(arch, tmp_path, tokenizer_json, seed=3, **overrides)
    with torch.inference_mode():
        want = run_steps(load_model(str(tmp_path), dtype="float32", progress=False).model)
    got = run_tensor_parallel(tmp_path, size, single_machine)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_heads_that_do_not_divide_are_refused(tmp_path, tokenizer_json):
    from corellm.model.model_config import ModelConfig
    from corellm.model.tensor_parallel import check_divisible

    make_tiny_model("llama3", tmp_path, tokenizer_json, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    config = ModelConfig.from_hf_config(__import__("json").loads((tmp_path / "config.json").read_text()))
    with pytest.raises(ValueError, match="tensor_parallel_size 2 does not divide the model's 9 attention heads"):
        check_divisible(config, 2)
    check_divisible(config, 3)
