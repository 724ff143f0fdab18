"""Embedding throughput of an encoder-only model (BERT): corellm's LLM.embed against transformers'
BertModel (what sentence-transformers runs), on the same random weights in the shape of a known
embedder, cached under build/embeddings/:

  minilm    all-MiniLM-L6-v2: 6 layers, hidden 384, 12 heads, MLP 1536, 30522 words
  bge-base  bge-base-en-v1.5 / BERT-base: 12 layers, hidden 768, 12 heads, MLP 3072

Inputs: --num-prompts token-id inputs of lengths drawn uniformly from [--min-len, --max-len]
(seeded), each as the tokenizer would frame it ([CLS] ... [SEP]). transformers runs them in
batches of --hf-batch-size, in input order, padded to the batch's longest with an attention mask
(its default SDPA attention), under torch.inference_mode, in the same dtype; both mean-pool and
L2-normalize. Printed: a table of inputs/s and tokens/s per engine and the ratio, the path each
ran, and the two engines' agreement (the smallest cosine similarity between their vectors of one
input).

    .venv/bin/python bench/embeddings.py --shape minilm --num-prompts 512
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benches' helpers

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "embeddings"
SHAPES = {
    "minilm": dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "bge-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}
VOCAB, CLS, SEP = 30522, 101, 102


def model_dir(shape: str) -> Path:
    """The random BertModel of `shape` (weights N(0, 0.02) as transformers initializes them, seed
    0), saved with a word-level tokenizer and a mean-pooling sentence-transformers config."""
    import torch
    from tokenizers import Tokenizer, models
    from hf_transformers import import_transformers

    directory = CACHE / shape
    if (directory / "model.safetensors").exists():
        return directory
    transformers = import_transformers()
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=VOCAB, max_position_embeddings=512, **SHAPES[shape])
    transformers.BertModel(config, add_pooling_layer=False).save_pretrained(directory, safe_serialization=True)
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0")).save(
        str(directory / "tokenizer.json"))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
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
    import torch
    from hf_transformers import import_transformers

    transformers = import_transformers()
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    model = transformers.BertModel.from_pretrained(directory, dtype=torch_dtype).eval()

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
    return [v.tolist() for v in vectors], seconds, f"transformers {transformers.__version__} (torch {torch.__version__})"


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
    args = p.parse_args()
    import numpy as np
    import torch

    directory = model_dir(args.shape)
    prompts = inputs(args.num_prompts, args.min_len, args.max_len, args.seed)
    tokens = sum(map(len, prompts))
    ours, our_s, our_name = run_corellm(directory, prompts, args.dtype, args.max_num_seqs)
    theirs, their_s, their_name = run_transformers(directory, prompts, args.dtype, args.hf_batch_size)
    cosine = min(float(np.dot(a, b)) for a, b in zip(ours, theirs))
    print(f"\n{args.shape}, {args.num_prompts} inputs of {args.min_len}-{args.max_len} tokens ({tokens} in all), "
          f"{args.dtype}, {torch.get_num_threads()} threads")
    print("| engine | seconds | inputs/s | tokens/s |\n|---|---|---|---|")
    for name, seconds in ((our_name, our_s), (their_name, their_s)):
        print(f"| {name} | {seconds:.2f} | {args.num_prompts / seconds:.1f} | {tokens / seconds:.0f} |")
    print(f"\ncorellm / transformers: {their_s / our_s:.2f}x; smallest cosine between their vectors of one input: "
          f"{cosine:.5f}")


if __name__ == "__main__":
    main()
