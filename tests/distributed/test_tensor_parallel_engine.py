"""The engine with tensor_parallel_size > 1 (worker processes over gloo on loopback): greedy
tokens equal the single-process engine's (fp32, up to the first near-tie of the reference) on a
tiny model (a Llama, a Gemma 3 and a Qwen2-MoE) and on SmolLM2-135M (9 heads, 3 KV heads: three ranks), and
follow it on the default model's quantized GGUF and in bf16; what it cannot do is refused by name."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from corellm import LLM, SamplingParams  # noqa: E402
from tests.model.tiny_models import make_tiny_model  # noqa: E402


def first_near_tie(logprobs, margin: float = 1e-3) -> int:
    for i, position in enumerate(logprobs):
        top = sorted((v.logprob for v in position.values()), reverse=True)
        if len(top) > 1 and top[0] - top[1] < margin:
            return i
    return len(logprobs)


def assert_same_greedy(reference, other) -> None:
    for want, got in zip(reference, other):
        w, g = want.outputs[0], got.outputs[0]
        n = first_near_tie(w.logprobs)
        assert list(g.token_ids[:n]) == list(w.token_ids[:n]), f"diverged before position {n}"
        for i in range(n):
            tok = w.token_ids[i]
            assert abs(w.logprobs[i][tok].logprob - g.logprobs[i][tok].logprob) < 1e-3


def assert_follows(reference, other, margin: float = 0.1) -> int:
    """bf16 over ranks against one process: tokens equal until a position where the reference's
    top two are within `margin`, logprobs within `margin` (bf16 partial sums added over the group
    round differently from one chain). Returns the positions compared."""
    compared = 0
    for want, got in zip(reference, other):
        w, g = want.outputs[0], got.outputs[0]
        same = next((i for i, (a, b) in enumerate(zip(w.token_ids, g.token_ids)) if a != b), len(w.token_ids))
        if same < len(w.token_ids):  # a divergence only where the reference's top two nearly tie
            top = sorted((v.logprob for v in w.logprobs[same].values()), reverse=True)
            assert top[0] - top[1] < margin, f"diverged at position {same} with a margin of {top[0] - top[1]:.3f}"
        for i in range(same):
            tok = w.token_ids[i]
            assert abs(w.logprobs[i][tok].logprob - g.logprobs[i][tok].logprob) < margin
        compared += same
    return compared


def generate(llm: LLM, prompts, tokens: int = 12):
    try:
        return llm.generate(prompts, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, logprobs=2),
                            use_tqdm=False)
    finally:
        llm.shutdown()


def test_tiny_model_three_ranks_equal_one(tmp_path, tokenizer_json):
    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    g = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 384, (n,), generator=g).tolist()} for n in (5, 23, 40, 2)]
    common = dict(dtype="float32", max_model_len=128, kv_cache_memory=16 * 1024**2, max_num_batched_tokens=32)
    one = generate(LLM(str(tmp_path), **common), prompts)
    for disable_custom_all_reduce in (False, True):  # the all-reduces through shared memory, then gloo
        llm = LLM(str(tmp_path), tensor_parallel_size=3, disable_custom_all_reduce=disable_custom_all_reduce, **common)
        shm = llm.engine_core.model_runner.tp_workers.tp.shm_all_reduce
        assert (shm is None) == disable_custom_all_reduce
        assert_same_greedy(one, generate(llm, prompts))  # chunked: 32 tokens a step


def test_prompt_logprobs_of_three_ranks_equal_one(tmp_path, tokenizer_json):
    """Prompts scored in chunks of 32 tokens a step: rank 0 tells the workers which rows' logits
    the step gathers for prompt logprobs, so that their collectives pair up."""
    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    g = torch.Generator().manual_seed(1)
    prompts = [{"prompt_token_ids": torch.randint(0, 384, (n,), generator=g).tolist()} for n in (5, 40, 23)]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, prompt_logprobs=2)
    common = dict(dtype="float32", max_model_len=128, kv_cache_memory=16 * 1024**2, max_num_batched_tokens=32)
    results = []
    for size in (1, 3):
        llm = LLM(str(tmp_path), tensor_parallel_size=size, **common)
        try:
            results.append(llm.generate(prompts, params, use_tqdm=False))
        finally:
            llm.shutdown()
    for one, three in zip(*results):
        ids = one.prompt_token_ids
        assert three.prompt_logprobs[0] is None and len(three.prompt_logprobs) == len(ids)
        for p in range(1, len(ids)):
            want, got = one.prompt_logprobs[p][ids[p]], three.prompt_logprobs[p][ids[p]]
            assert abs(want.logprob - got.logprob) < 1e-4


def test_speculative_decoding_with_three_ranks_is_bit_identical_to_none():
    """SmolLM2 bf16 over three ranks (native stacks, shared-memory all-reduce): the drafts — n-gram,
    or a draft model (here the model itself) that runs whole in rank 0 — are verified by rank 0 on
    logits rows the workers compute alongside (the step's logits_indices), and the greedy tokens and
    logprobs equal those of the same engine without drafts, bit for bit."""
    from corellm.model.loader import default_model_path
    from tests.engine.test_speculative import COPY, NGRAM

    params = SamplingParams(temperature=0, max_tokens=24, logprobs=2)
    common = dict(tensor_parallel_size=3, max_model_len=256, kv_cache_memory=32 * 1024**2)
    runs = []
    for spec in (None, NGRAM, {"model": str(default_model_path()), "num_speculative_tokens": 3}):
        llm = LLM(speculative_config=spec, **common)
        try:
            outs = llm.generate(COPY, params, use_tqdm=False)
            runs.append([(o.outputs[0].token_ids, [sorted((t, l.logprob) for t, l in s.items())
                                                   for s in o.outputs[0].logprobs]) for o in outs])
            if spec is not None:
                assert llm.get_metrics()["corellm:spec_decode_num_accepted_tokens"] > 0
        finally:
            llm.shutdown()
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("arch, size, overrides", [
    # Gemma 3's variant of the layer: sandwich norms, GeGLU, scaled embeddings, sliding layers beside
    # a global one
    ("gemma3", 3, dict(hidden_size=72, num_attention_heads=3, num_key_value_heads=3, intermediate_size=192)),
    # Gemma 2's: the same without q/k norms, each rank's heads' scores soft-capped, the logits capped
    ("gemma2", 3, dict(hidden_size=72, num_attention_heads=3, num_key_value_heads=3, intermediate_size=192)),
    # SmolLM3: its middle layer turns no rotary embedding (NoPE), on every rank
    ("smollm3", 2, {}),
    # ERNIE 4.5: rotary on each head's interleaved pairs
    ("ernie4_5", 2, {}),
    # GLM-4: q/k/v biases, gate and up fused in the checkpoint, interleaved rotary on half of each head,
    # norms on the attention's and the MLP's outputs
    ("glm4", 2, {}),
    # a mixture of experts (four, two per token, and a shared expert): each rank holds its share of
    # every expert and the whole router
    ("qwen2_moe", 2, {}),
    # OLMoE: q and k normed over each token's whole rows, gathered from the ranks
    ("olmoe", 2, {}),
    # Olmo 3: OLMo 2's layers (no pre-norms, whole-row q/k norms) and sliding-window layers
    ("olmo3", 2, {}),
])
def test_tiny_model_variants_over_ranks_equal_one(tmp_path, tokenizer_json, arch, size, overrides):
    """In fp32 op by op, equal to one process; in bf16 rank 0 runs the native decoder stack, and
    the ranks follow one process: tokens equal until a position where the reference's top two are
    within 0.1, logprobs within 0.1 (bf16 partial sums added over the group round differently from
    one chain)."""
    make_tiny_model(arch, tmp_path, tokenizer_json, seed=5, **overrides)
    g = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 384, (n,), generator=g).tolist()} for n in (5, 23, 40, 2)]
    common = dict(max_model_len=128, kv_cache_memory=16 * 1024**2, max_num_batched_tokens=32)
    one = generate(LLM(str(tmp_path), dtype="float32", **common), prompts)
    split = LLM(str(tmp_path), dtype="float32", tensor_parallel_size=size, **common)
    assert_same_greedy(one, generate(split, prompts))
    one = generate(LLM(str(tmp_path), dtype="bfloat16", **common), prompts)
    split = LLM(str(tmp_path), dtype="bfloat16", tensor_parallel_size=size, **common)
    assert split.engine_core.model_runner.native_stack is not None
    assert assert_follows(one, generate(split, prompts)) >= 24


def test_an_fp8_kv_cache_over_ranks_follows_one(tmp_path, tokenizer_json):
    """kv_cache_dtype fp8: every rank holds its KV heads in fp8 e4m3 (rank 0 tells the workers the
    element type with the blocks), and three ranks follow one process with the same cache, as bf16
    ones do."""
    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    g = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 384, (n,), generator=g).tolist()} for n in (5, 23, 40, 2)]
    common = dict(dtype="bfloat16", kv_cache_dtype="fp8", max_model_len=128, kv_cache_memory=16 * 1024**2,
                  max_num_batched_tokens=32)
    one_llm = LLM(str(tmp_path), **common)
    assert one_llm.engine_core.model_runner.kv_caches[0][0].dtype == torch.float8_e4m3fn
    one = generate(one_llm, prompts)
    split = LLM(str(tmp_path), tensor_parallel_size=3, **common)
    per_rank = split.engine_core.model_runner.tp_workers.collective_rpc("memory_usage")
    blocks = split.engine_core.scheduler_config.num_blocks
    # per rank one KV head of 8 dims, a byte each, keys and values, 3 layers, 16-token blocks
    assert [m["kv_cache_bytes"] for m in per_rank] == [blocks * 16 * 8 * 2 * 3] * 2
    assert assert_follows(one, generate(split, prompts)) >= 24


def test_smollm2_three_ranks_equal_one():
    prompts = ["The capital of France is", "def fibonacci(n):"]
    common = dict(dtype="float32", quantization="none", max_model_len=128, kv_cache_memory=32 * 1024**2)
    one = generate(LLM(**common), prompts, tokens=16)
    three = generate(LLM(tensor_parallel_size=3, **common), prompts, tokens=16)
    assert_same_greedy(one, three)


def test_smollm2_gguf_three_ranks_follow_one():
    """The default model as it is (its Q4_1 / Q8_0 tensors cut in their packed form, the same bits
    on every rank): three ranks follow one process, by the rule quantized models are held to
    (tokens equal up to the reference's first top-2 margin under 0.25). Not bit for bit: o and
    down sum their blocks in three partial sums added over the group, where one process sums them
    in one chain, and the next layer's activations, quantized to int8, amplify the difference
    (measured: the greedy token's logprob moves by up to 0.24 nats in bf16, 0.15 in fp32). Where a
    prompt's first near tie falls depends on the CPU's path (on an AVX2-only Zen 3 the second
    prompt's second token has a margin of 0.22), so the prompts together must give 8 clear tokens."""
    prompts = ["The capital of France is", "def fibonacci(n):", "The three primary colors are"]
    common = dict(max_model_len=128, kv_cache_memory=32 * 1024**2)
    one_llm = LLM(**common)
    assert one_llm.loaded.quantization == "gguf"
    one = generate(one_llm, prompts, tokens=16)
    three_llm = LLM(tensor_parallel_size=3, **common)
    weights = three_llm.loaded.model.weight_bytes()
    assert three_llm.loaded.quantization == "gguf" and {"Q4_1", "Q8_0"} <= set(weights)
    three = generate(three_llm, prompts, tokens=16)
    compared = 0
    for want, got in zip(one, three):
        w, g = want.outputs[0], got.outputs[0]
        n = first_near_tie(w.logprobs, margin=0.25)
        assert list(g.token_ids[:n]) == list(w.token_ids[:n]), f"diverged before position {n}"
        for i in range(n):
            tok = w.token_ids[i]
            assert abs(w.logprobs[i][tok].logprob - g.logprobs[i][tok].logprob) < 0.3
        compared += n
    assert compared >= 8, f"only {compared} tokens before the reference's near ties"


def test_tiny_llava_two_ranks_equal_one(tmp_path):
    """Image inputs over two ranks: rank 0 alone holds the vision tower, encodes the images and
    sends each step's image rows with the step; every rank merges them into its embedding rows.
    fp32: greedy tokens and logprobs equal one process's (one image, two, none), with prefill in
    chunks of 12 tokens that cut through the 16 placeholders of an image."""
    pytest.importorskip("PIL")
    from tests.multimodal.tiny_llava import IMAGE_TOKEN, make_tiny_llava, random_image

    make_tiny_llava(tmp_path, "clip", "llama", seed=3)
    prompts = [{"prompt_token_ids": [5, 17, IMAGE_TOKEN, 40, 41, 3], "multi_modal_data": {"image": random_image(1)}},
               {"prompt_token_ids": [9, 8, 7, 6, 5, 4]},
               {"prompt_token_ids": [IMAGE_TOKEN, 6, IMAGE_TOKEN, 2],
                "multi_modal_data": {"image": [random_image(2), random_image(3, (30, 70))]}}]
    common = dict(dtype="float32", max_model_len=256, kv_cache_memory=16 * 1024**2, max_num_batched_tokens=12,
                  limit_mm_per_prompt={"image": 2})
    one = generate(LLM(str(tmp_path), **common), prompts)
    two_llm = LLM(str(tmp_path), tensor_parallel_size=2, **common)
    rank0 = sum(two_llm.loaded.model.weight_bytes().values())
    (rank1,) = two_llm.engine_core.model_runner.tp_workers.collective_rpc("memory_usage")
    assert rank1["weight_bytes"] < rank0  # half the decoder, no tower or projector
    assert_same_greedy(one, generate(two_llm, prompts))


@pytest.mark.parametrize("arch, size, overrides", [
    ("llama3", 3, dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, intermediate_size=192)),
    ("mixtral", 2, {}),  # every expert's w1 / w3 / w2 quantized, each rank's half cut from the blocks
])
def test_int8_weights_over_ranks_follow_one(tmp_path, tokenizer_json, arch, size, overrides):
    """--quantization int8 (an HF checkpoint's projections quantized at load, one scale per output
    row, kept in Q8_0 blocks) over several ranks: every rank quantizes the whole checkpoint alike and
    keeps its cut of the blocks, and its slices of o / down start on 32-value activation blocks; the
    partial sums meet over the group, so the prompts' logprobs (scored on the same tokens, no greedy
    divergence on a tiny random model's near-ties) follow one process's within 0.05."""
    make_tiny_model(arch, tmp_path, tokenizer_json, seed=5, **overrides)
    g = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 384, (n,), generator=g).tolist()} for n in (5, 23, 40)]
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    common = dict(dtype="float32", quantization="int8", max_model_len=128, kv_cache_memory=16 * 1024**2)
    results = []
    for ranks in (1, size):
        llm = LLM(str(tmp_path), tensor_parallel_size=ranks, **common)
        try:
            assert llm.loaded.quantization == "int8" and "Q8_0" in llm.loaded.model.weight_bytes()
            results.append(llm.generate(prompts, params, use_tqdm=False))
        finally:
            llm.shutdown()
    drift = 0.0
    for one, three in zip(*results):
        ids = one.prompt_token_ids
        for p in range(1, len(ids)):
            drift = max(drift, abs(one.prompt_logprobs[p][ids[p]].logprob - three.prompt_logprobs[p][ids[p]].logprob))
    assert drift < 0.05, f"prompt logprobs moved by up to {drift:.3f}"


def test_what_tensor_parallelism_refuses():
    with pytest.raises(ValueError, match="tensor_parallel_size 2 does not divide the model's 9 attention heads"):
        LLM(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must be a multiple of nnodes 2"):
        LLM(tensor_parallel_size=3, nnodes=2, master_port=1234)
    with pytest.raises(ValueError, match="several nodes need master_port"):
        LLM(tensor_parallel_size=2, nnodes=2)
    llm = LLM(tensor_parallel_size=3, dtype="float32", max_model_len=64, kv_cache_memory=16 * 1024**2)
    try:
        workers = llm.engine_core.model_runner.tp_workers
        usage = workers.collective_rpc("memory_usage")  # every worker's answer, in rank order
        assert [u["rank"] for u in usage] == [1, 2] and all(u["kv_cache_bytes"] > 0 for u in usage)
        assert {u["weight_bytes"] for u in usage} == {sum(llm.loaded.model.weight_bytes().values())}  # equal shares
        with pytest.raises(ValueError, match="workers have no method 'shutdown_now'"):
            workers.collective_rpc("shutdown_now")
        with pytest.raises(RuntimeError, match="rank 1: setup_kv_cache: TypeError"):
            workers.collective_rpc("setup_kv_cache")  # a call that fails on the workers: reported, serving goes on
        assert llm.generate("hi", SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
    finally:
        llm.shutdown()


def test_a_killed_worker_ends_the_engine_with_an_error_not_a_hang(tmp_path, tokenizer_json):
    import os
    import signal
    import time

    from corellm.engine.engine_core import TensorParallelError

    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    llm = LLM(str(tmp_path), tensor_parallel_size=3, dtype="float32", max_model_len=64, kv_cache_memory=16 * 1024**2)
    try:
        assert llm.engine_core.health_error() is None
        worker = llm.engine_core.model_runner.tp_workers._processes[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(timeout=10)
        assert "corellm-tp1 exited with -9" in llm.engine_core.health_error()
        started = time.monotonic()
        with pytest.raises(TensorParallelError, match="a worker process died: corellm-tp1 exited with -9"):
            llm.generate({"prompt_token_ids": [1, 2, 3]}, SamplingParams(max_tokens=4), use_tqdm=False)
        assert time.monotonic() - started < 70  # the collectives' timeout bounds it; a closed socket fails at once
    finally:
        llm.shutdown()


def test_two_nodes_on_loopback(tmp_path, tokenizer_json):
    """Node 1 is `corellm serve --headless` in another process; node 0 is this process's engine;
    the ranks meet at 127.0.0.1:PORT. Tokens equal the single process's; stopping the engine ends
    node 1 with status 0."""
    import os
    import subprocess
    import sys

    from corellm.worker.tp_workers import free_local_port

    make_tiny_model("qwen2", tmp_path, tokenizer_json, seed=6, num_attention_heads=4, num_key_value_heads=2)
    port = free_local_port()
    nodes = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    node1 = subprocess.Popen([sys.executable, "-m", "corellm.cli", "serve", str(tmp_path), "--headless", "--node-rank",
                              "1", "--dtype", "float32", *nodes], env={**os.environ, "TQDM_DISABLE": "1"})
    try:
        prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": list(range(40, 70))}]
        common = dict(dtype="float32", max_model_len=128, kv_cache_memory=16 * 1024**2)
        two = generate(LLM(str(tmp_path), tensor_parallel_size=2, nnodes=2, master_port=port, **common), prompts)
        assert node1.wait(timeout=60) == 0
        one = generate(LLM(str(tmp_path), **common), prompts)
        assert_same_greedy(one, two)
    finally:
        if node1.poll() is None:
            node1.kill()
    with pytest.raises(ValueError, match="only node 0 runs the engine"):
        LLM(str(tmp_path), tensor_parallel_size=2, nnodes=2, node_rank=1, master_port=port)
