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
