"""Whether corellm and llama.cpp compute the same model: llama-server's greedy tokens (with their
top-2 logprobs) for a few prompts, scored by corellm's prompt logprobs over them. A position counts
only where llama.cpp's top-2 margin is clear (a near-tie is no oracle for either engine's order):
there corellm's top token should be llama.cpp's, and the chosen token's logprobs close."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from server_process import free_port, wait_ready

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "The three primary colors are",
           "To make a cup of tea, first", "Water boils at"]
CLEAR_MARGIN = 0.25  # nats between llama.cpp's top two tokens


def llama_greedy(bin_dir: Path, model: Path, prompts: list[str], max_tokens: int,
                 extra_args: tuple[str, ...] = ()) -> list[dict]:
    """llama-server's /completion reply (tokens, top-2 logprobs per position) for each prompt,
    greedy; extra_args: more llama-server flags (--lora FILE)."""
    port = free_port()
    proc = subprocess.Popen([str(bin_dir / "llama-server"), "-m", str(model), *extra_args, "-c", "1024", "-np", "1",
                             "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout=300)
        replies = []
        for prompt in prompts:
            body = {"prompt": prompt, "n_predict": max_tokens, "temperature": 0, "top_k": 1, "cache_prompt": False,
                    "n_probs": 2, "return_tokens": True}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                replies.append(json.loads(r.read()))
        return replies
    finally:
        proc.terminate()
        proc.wait()


@dataclass
class Agreement:
    agree: int  # positions where corellm's top token is llama.cpp's
    clear: int  # positions where llama.cpp's top-2 margin exceeds CLEAR_MARGIN
    worst: float  # the largest difference of the chosen token's logprob

    def __str__(self) -> str:
        return (f"corellm's top token is llama.cpp's at {self.agree} of {self.clear} positions where llama.cpp's "
                f"top-2 margin exceeds {CLEAR_MARGIN} nats; the chosen tokens' logprobs differ by at most "
                f"{self.worst:.3f}")


def score(llm, prompts: list[str], replies: list[dict], lora_request=None) -> Agreement:
    """llama.cpp's replies scored by corellm's LLM (its prompt logprobs over prompt + reply)."""
    from corellm import SamplingParams

    tokenizer = llm.get_tokenizer()
    clear = agree = 0
    worst = 0.0
    for prompt, reply in zip(prompts, replies):
        ids = tokenizer.encode(prompt)
        scored = llm.generate({"prompt_token_ids": ids + reply["tokens"]},
                              SamplingParams(max_tokens=1, prompt_logprobs=1), use_tqdm=False,
                              lora_request=lora_request)[0].prompt_logprobs
        for j, (token, probs) in enumerate(zip(reply["tokens"], reply["completion_probabilities"])):
            top = probs["top_logprobs"]
            if top[0]["logprob"] - top[1]["logprob"] <= CLEAR_MARGIN:
                continue
            ours = scored[len(ids) + j]
            clear += 1
            agree += max(ours, key=lambda t: ours[t].logprob) == token
            worst = max(worst, abs(ours[token].logprob - top[0]["logprob"]))
    return Agreement(agree, clear, worst)


def agreement_on_file(bin_dir: Path, model: Path) -> Agreement:
    """llama-server's greedy replies to PROMPTS on the GGUF `model`, scored by a corellm LLM on the
    same file (bf16, its quantized tensors as they are)."""
    from corellm import LLM

    replies = llama_greedy(bin_dir, model, PROMPTS, 24)
    llm = LLM(str(model), kv_cache_memory=256 * 2**20, max_model_len=1024)
    try:
        return score(llm, PROMPTS, replies)
    finally:
        llm.shutdown()


def compare_speed_on_file(model: Path, args) -> None:
    """bench/compare_llamacpp.py --gguf `model` with a bench's --threads, --concurrency, --num-prompts
    and --skip-single-stream / --skip-serving (nothing when both are set)."""
    import subprocess
    import sys

    if args.skip_single_stream and args.skip_serving:
        return
    flags = [f for f, on in (("--skip-single-stream", args.skip_single_stream), ("--skip-serving", args.skip_serving))
             if on]
    subprocess.run([sys.executable, str(Path(__file__).parent / "compare_llamacpp.py"), "--gguf", str(model),
                    "--threads", str(args.threads), "--concurrency", args.concurrency, "--num-prompts",
                    str(args.num_prompts), *flags], check=True)


def add_file_comparison_args(p, quant: str) -> None:
    """The flags of a bench that makes a GGUF file and compares the engines on it (moe.py, gpt_oss.py):
    the llama-quantize type (default `quant`), then agreement_on_file's and compare_speed_on_file's."""
    import os

    p.add_argument("--quant", default=quant, help="llama-quantize type of the file both engines run (BF16: none)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--skip-agreement", action="store_true")
    p.add_argument("--skip-single-stream", action="store_true")
    p.add_argument("--skip-serving", action="store_true")


def quantized_file(bin_dir: Path, bf16: Path, quant: str) -> Path:
    """The BF16 GGUF `bf16` made `quant` by llama-quantize, beside it (cached; BF16: the file itself)."""
    import subprocess

    if quant == "BF16":
        return bf16
    quantized = bf16.with_name(bf16.name.replace(".BF16.gguf", f".{quant}.gguf"))
    if not quantized.exists():
        subprocess.run([str(bin_dir / "llama-quantize"), str(bf16), str(quantized.with_suffix(".tmp")), quant],
                       stdout=subprocess.DEVNULL, check=True)
        quantized.with_suffix(".tmp").rename(quantized)
    return quantized
