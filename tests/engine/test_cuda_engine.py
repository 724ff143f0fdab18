"""The engine on a CUDA device (LLM(device="cuda")): the model, its KV cache, every op and the
sampler on the GPU, decode steps replayed as CUDA graphs. Greedy outputs of a tiny random Llama
in fp32 must equal the CPU engine's up to the first reference near-tie. Skipped without
corellm._cuda and a GPU."""

from __future__ import annotations

import pytest
import torch

from corellm import LLM, SamplingParams
from corellm.ops._backend import cuda_available

pytestmark = pytest.mark.skipif(not (cuda_available() and torch.cuda.is_available()),
                                reason="needs corellm._cuda and a CUDA GPU")


def save_word_tokenizer(directory) -> None:
    """A word-level tokenizer over the tiny models' 384 ids ("w0" .. "w383")."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(384)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.model.tiny_models import make_tiny_model

    directory = tmp_path_factory.mktemp("tiny_cuda")
    save_word_tokenizer(directory)
    make_tiny_model("llama3", directory, seed=11)
    return directory


def cuda_llm(model_dir, **kw) -> LLM:
    """An engine on the GPU sized for a test: a 64 MiB KV cache (not 90 % of the device) and at
    most 16 running requests (7 decode graphs to capture, not 35)."""
    args = dict(device="cuda", dtype="float32", max_model_len=128, max_num_seqs=16, kv_cache_memory=64 * 1024**2)
    args.update(kw)
    return LLM(str(model_dir), **args)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_engine_matches_the_cpu_engine(tiny_dir, dtype):
    g = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 384, (n,), generator=g).tolist()} for n in (5, 17, 40, 3)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    cpu = LLM(str(tiny_dir), dtype=dtype, device="cpu", max_model_len=128).generate(prompts, params, use_tqdm=False)
    gpu = cuda_llm(tiny_dir, dtype=dtype).generate(prompts, params, use_tqdm=False)
    for c, g_ in zip(cpu, gpu):
        got, want = g_.outputs[0].token_ids, c.outputs[0].token_ids
        if dtype == "float32":
            n = first_near_tie(c.outputs[0].logprobs)
            assert got[:n] == want[:n]
        else:
            assert len(got) == len(want) == 16  # bf16: other GEMMs on each side; the run must complete


def test_cuda_prompt_logprobs_match_the_cpu_engine(tiny_dir):
    """Prompt logprobs on the GPU (torch's log_softmax over each piece of rows) against the CPU
    engine's (ops.token_logprobs' kernel), fp32: each prompt token's logprob within 1e-4, and the
    same most likely token where the reference's top two are clearly apart."""
    prompt = {"prompt_token_ids": torch.randint(0, 384, (40,), generator=torch.Generator().manual_seed(3)).tolist()}
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2)
    cpu = LLM(str(tiny_dir), dtype="float32", device="cpu", max_model_len=128, max_num_seqs=4)
    want = cpu.generate(prompt, params, use_tqdm=False)[0].prompt_logprobs
    got = cuda_llm(tiny_dir, max_num_seqs=4).generate(prompt, params, use_tqdm=False)[0].prompt_logprobs
    assert want[0] is None and got[0] is None and len(got) == len(want) == 40
    for p in range(1, 40):
        token = prompt["prompt_token_ids"][p]
        assert abs(got[p][token].logprob - want[p][token].logprob) < 1e-4
        top = sorted(want[p].items(), key=lambda item: -item[1].logprob)
        if top[0][1].logprob - top[1][1].logprob > 1e-3:
            assert got[p][top[0][0]].rank == 1


@pytest.mark.parametrize("machinery", ["batch of 8", "chunked prefill", "prefix-cache hit"])
def test_cuda_engine_consistency(tiny_dir, machinery):
    """Each prompt's greedy tokens (fp32) alone on the GPU equal those under the engine's machinery
    — other batch sizes (other graphs), chunks of 16 tokens, a cached prefix — up to the first
    near-tie."""
    g = torch.Generator().manual_seed(5)
    shared = torch.randint(0, 384, (40,), generator=g).tolist()
    prompts = [{"prompt_token_ids": (shared if i % 2 else []) + torch.randint(0, 384, (5 + 7 * i,),
                                                                             generator=g).tolist()}
               for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    llm = cuda_llm(tiny_dir, max_model_len=256, max_num_batched_tokens=16 if machinery == "chunked prefill" else 2048)
    alone = [llm.generate(p, params, use_tqdm=False)[0].outputs[0] for p in prompts]
    if machinery == "prefix-cache hit":
        llm.generate(prompts, params, use_tqdm=False)
    together = llm.generate(prompts, params, use_tqdm=False)
    for a, t in zip(alone, together):
        n = first_near_tie(a.logprobs)
        assert t.outputs[0].token_ids[:n] == a.token_ids[:n]


def test_a_head_size_without_a_cuda_kernel_is_refused_at_load(tmp_path):
    pytest.importorskip("transformers")
    from tests.model.tiny_models import make_tiny_model

    save_word_tokenizer(tmp_path)
    make_tiny_model("qwen3", tmp_path, seed=1, head_dim=72)
    with pytest.raises(ValueError, match="head_dim 72"):
        cuda_llm(tmp_path)


def first_near_tie(logprobs, margin: float = 1e-3) -> int:
    """The first step whose two most likely tokens are within `margin` (past it, either side's
    choice is right), or the number of steps."""
    for i, position in enumerate(logprobs):
        top = sorted((v.logprob for v in position.values()), reverse=True)
        if len(top) > 1 and top[0] - top[1] < margin:
            return i
    return len(logprobs)


def test_cuda_speculative_decoding_matches_plain(tiny_dir):
    """n-gram speculation on the GPU (eager verification steps, the CUDA rejection sampler):
    greedy fp32 tokens equal the plain GPU engine's up to the first near-tie, and drafts ran."""
    pattern = list(range(40, 72))
    prompts = [{"prompt_token_ids": pattern * 3}, {"prompt_token_ids": pattern[5:] * 2 + pattern[:9]}]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    plain = cuda_llm(tiny_dir).generate(prompts, params, use_tqdm=False)
    spec_llm = cuda_llm(tiny_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                                                      "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    spec = spec_llm.generate(prompts, params, use_tqdm=False)
    for p, s in zip(plain, spec):
        n = first_near_tie(p.outputs[0].logprobs)
        assert s.outputs[0].token_ids[:n] == p.outputs[0].token_ids[:n]
    assert spec_llm.get_metrics()["corellm:spec_decode_num_draft_tokens"] > 0


def test_an_encoder_on_cuda_gives_the_cpus_vectors_and_scores(tmp_path):
    """An encoder-only model (model/bert.py: corellm's Linear and torch's attention per input) on
    the GPU: a BERT's mean-pooled vectors and a cross-encoder's scores, with token types, are the
    CPU engine's in fp32 (within the two devices' GEMM rounding); so are a Nomic BERT's (rotary
    positions and SwiGLU through the CUDA kernels)."""
    pytest.importorskip("transformers")
    from tests.model.test_bert import make_encoder, write_bert_tokenizer

    tokenizer_json = write_bert_tokenizer(tmp_path)
    texts = ["w5 w7 w9 w11 w13", "w3", "w300 w17 w17 w4 w99 w100 w101 w250"]
    for name, family, labels in (("embedder", "bert", None), ("cross_encoder", "bert", ("relevance",)),
                                 ("nomic", "nomic", None)):
        directory = tmp_path / name
        directory.mkdir()
        make_encoder(family, directory, tokenizer_json, seed=9, labels=labels, pooling="mean_tokens")
        cpu = LLM(str(directory), dtype="float32", device="cpu", max_num_seqs=8)
        gpu = LLM(str(directory), dtype="float32", device="cuda", max_num_seqs=8)
        if labels is None:
            want = torch.tensor([o.outputs.embedding for o in cpu.embed(texts, use_tqdm=False)])
            got = torch.tensor([o.outputs.embedding for o in gpu.embed(texts, use_tqdm=False)])
        else:
            want = torch.tensor([o.outputs.score for o in cpu.score(texts[0], texts, use_tqdm=False)])
            got = torch.tensor([o.outputs.score for o in gpu.score(texts[0], texts, use_tqdm=False)])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
