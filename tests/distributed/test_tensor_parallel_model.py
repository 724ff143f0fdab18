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


def run_steps(model, native: bool = False) -> list[torch.Tensor]:
    runner = PagedRunner(model, 64, len(PROMPTS), block_size=8, seed=2, native=native)
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


def rank_native_main(rank: int, size: int, init: str, directory: str, results) -> None:
    """bf16: the steps op by op, then the same steps through the native decoder stack (each with
    its own KV cache); rank 0 sends both."""
    from corellm.distributed.parallel_state import init_tensor_parallel
    from corellm.model.loader import load_model
    from corellm.model.native_stack import supports

    torch.set_num_threads(1)
    tp = init_tensor_parallel(rank, size, init, torch.device("cpu"), shm_all_reduce=True)
    model = load_model(directory, dtype="bfloat16", progress=False, tensor_parallel=tp).model
    assert supports(model)
    with torch.inference_mode():
        per_op, native = run_steps(model), run_steps(model, native=True)
    if rank == 0:
        results.put([[t.numpy().copy() for t in per_op], [t.numpy().copy() for t in native]])
    torch.distributed.destroy_process_group()


def run_ranks(size: int, target, *args):
    """What rank 0 of `size` processes running target(rank, size, init, *args, results) sends."""
    from corellm.worker.tp_workers import free_local_port

    context = mp.get_context("spawn")
    results = context.Queue()
    init = f"tcp://127.0.0.1:{free_local_port()}"
    processes = [context.Process(target=target, args=(r, size, init, *args, results)) for r in range(size)]
    for p in processes:
        p.start()
    sent = results.get(timeout=120)
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0
    return sent


@pytest.mark.parametrize("arch, size, overrides, single_machine", [
    ("llama3", 3, dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=192), True),
    ("llama3", 3, dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=192), False),
    ("qwen2", 2, dict(num_attention_heads=4, num_key_value_heads=1), True),  # one KV head, replicated
    ("qwen3", 2, dict(num_attention_heads=4, num_key_value_heads=2, vocab_size=383), True),  # vocabulary padded
    ("llama_tied", 4, dict(num_attention_heads=4, num_key_value_heads=4), True),
    # mixtures of experts: every expert split, the router replicated, one all-reduce per layer
    ("mixtral", 2, {}, True),
    ("qwen3_moe", 2, {}, False),  # a dense layer among the sparse ones
    ("qwen2_moe", 2, {}, True),  # a shared expert and its gate
    ("ernie4_5_moe", 2, {}, False),  # an ungated shared expert, the choice's bias replicated with the router
    ("phi3", 2, {}, True),  # fused q/k/v and gate/up in the checkpoint, split and then sharded
    ("granite", 2, {}, True),  # the outputs scaled after their all-reduce, the logits after their gather
    ("granitemoe", 2, {}, False),  # its stacked experts split, then each expert's share cut
    # q and k normed over each token's whole rows, gathered from the ranks; then with one KV head
    # held by both ranks (the first of them puts its k into the gathered rows)
    ("olmoe", 2, {}, True),
    ("olmoe", 2, dict(num_key_value_heads=1), False),
    # gpt-oss: the sinks cut with the heads, o's and the experts' down biases in rank 0's partial sums
    ("gpt_oss", 2, {}, True),
])
def test_rank_zero_logits_equal_the_single_process_model(tmp_path, tokenizer_json, arch, size, overrides,
                                                         single_machine):
    from corellm.model.loader import load_model

    make_tiny_model(arch, tmp_path, tokenizer_json, seed=3, **overrides)
    with torch.inference_mode():
        want = run_steps(load_model(str(tmp_path), dtype="float32", progress=False).model)
    got = [torch.from_numpy(a) for a in run_ranks(size, rank_main, str(tmp_path), single_machine)]
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch, size, overrides", [
    ("llama3", 3, dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=192)),
    ("qwen2_moe", 2, {}),  # experts, a shared expert
    ("ernie4_5_moe", 2, {}),  # the choice's bias, an ungated shared expert
    ("olmoe", 2, {}),  # the whole q and k rows gathered inside the stack's call
    ("gpt_oss", 2, {}),  # sinks, biases, the clamped SwiGLU
])
def test_the_native_stack_under_tensor_parallelism_equals_the_per_op_forward(tmp_path, tokenizer_json, arch, size,
                                                                               overrides):
    """bf16, the all-reduces through shared memory: rank 0's logits through the native decoder
    stack (which all-reduces inside its one call) are bit-identical to the per-op forward's."""
    make_tiny_model(arch, tmp_path, tokenizer_json, seed=4, **overrides)
    per_op, native = run_ranks(size, rank_native_main, str(tmp_path))
    assert len(per_op) == len(native) == 1 + len(STEPS)
    for a, b in zip(per_op, native):
        assert a.shape == b.shape and a.tobytes() == b.tobytes()


def test_heads_that_do_not_divide_are_refused(tmp_path, tokenizer_json):
    from corellm.model.model_config import ModelConfig
    from corellm.model.tensor_parallel import check_divisible

    make_tiny_model("llama3", tmp_path, tokenizer_json, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    config = ModelConfig.from_hf_config(__import__("json").loads((tmp_path / "config.json").read_text()))
    with pytest.raises(ValueError, match="tensor_parallel_size 2 does not divide the model's 9 attention heads"):
        check_divisible(config, 2)
    check_divisible(config, 3)


@pytest.mark.parametrize("arch, overrides, message", [
    ("qwen2_moe", dict(moe_intermediate_size=66), r"does not divide the model's experts' intermediate size "
                                                  r"\(moe_intermediate_size\) 66"),
    ("qwen2_moe", dict(shared_expert_intermediate_size=90), "does not divide the model's shared expert's "
                                                            "intermediate size 90"),
    ("qwen3_moe", dict(intermediate_size=162), "does not divide the model's intermediate size 162"),  # layer 1's
])
def test_mixture_of_experts_sizes_that_do_not_split_are_refused(tmp_path, tokenizer_json, arch, overrides, message):
    """Each of an MoE model's MLP sizes must divide (a dense layer's only where the model has one)."""
    import json

    from corellm.model.model_config import ModelConfig
    from corellm.model.tensor_parallel import check_divisible

    make_tiny_model(arch, tmp_path, tokenizer_json, **overrides)
    config = ModelConfig.from_hf_config(json.loads((tmp_path / "config.json").read_text()))
    with pytest.raises(ValueError, match=message):
        check_divisible(config, 4)
    check_divisible(config, 1)


def test_an_unused_dense_intermediate_size_need_not_divide(tmp_path, tokenizer_json):
    """Every layer of this Qwen2-MoE is sparse: its dense intermediate_size (162) is never used."""
    import json

    from corellm.model.model_config import ModelConfig
    from corellm.model.tensor_parallel import check_divisible

    make_tiny_model("qwen2_moe", tmp_path, tokenizer_json, intermediate_size=162)
    check_divisible(ModelConfig.from_hf_config(json.loads((tmp_path / "config.json").read_text())), 2)
