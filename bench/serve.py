"""Serving load generator, like `vllm bench serve`, for any OpenAI-compatible server: sends
--num-prompts streamed requests (random-token or random-text prompts of --input-len tokens, each
generating --output-len tokens) at --request-rate (Poisson; inf = all at once) with at most
--max-concurrency in flight, and reports request and token throughput and TTFT / TPOT / ITL / E2E
mean, median, p90, p99. --concurrency 1,4,16,64 runs one pass per value; --json writes the results,
--plot draws them (needs matplotlib).

    .venv/bin/python bench/serve.py --base-url http://127.0.0.1:8000 --num-prompts 64 \\
        --max-concurrency 16 --input-len 128 --output-len 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p90": 0.0, "p99": 0.0}
    s = sorted(values)

    def pct(p: float) -> float:
        k = (len(s) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": statistics.fmean(s), "median": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)}


def make_prompts(args, rng: random.Random) -> list:
    if args.dataset == "random" and args.endpoint == "/v1/completions":
        # Token ids straight to the server: exactly input_len tokens whatever its tokenizer.
        return [[rng.randrange(1000, args.vocab_size) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    words = ["time", "river", "blue", "engine", "quiet", "market", "seven", "garden", "paper", "signal", "north",
             "bright", "window", "story", "metal", "cloud", "simple", "orange", "answer", "travel"]
    return [" ".join(rng.choice(words) for _ in range(args.input_len)) for _ in range(args.num_prompts)]


async def one_request(session: aiohttp.ClientSession, args, prompt) -> RequestResult:
    body = {"model": args.model, "max_tokens": args.output_len, "stream": True, "temperature": 0.0,
            "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.endpoint == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    result = RequestResult(False, len(prompt) if isinstance(prompt, list) else args.input_len)
    start = time.perf_counter()
    last = None
    chunks = 0
    try:
        async with session.post(args.base_url + args.endpoint, json=body) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return result
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = str(event["error"])
                    return result
                if event.get("usage"):
                    result.output_tokens = event["usage"].get("completion_tokens", result.output_tokens)
                    result.prompt_tokens = event["usage"].get("prompt_tokens", result.prompt_tokens)
                choices = event.get("choices") or []
                if not choices:
                    continue
                c = choices[0]
                text = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                if not text:
                    continue
                now = time.perf_counter()
                if last is None:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                chunks += 1
    except aiohttp.ClientError as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    result.e2e = time.perf_counter() - start
    result.output_tokens = result.output_tokens or chunks
    result.ok = True
    return result


async def run_pass(args, prompts: list, concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    rng = random.Random(args.seed)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with aiohttp.ClientSession(timeout=timeout, headers=headers,
                                     connector=aiohttp.TCPConnector(limit=0, force_close=True)) as session:  # no keep-alive races
        async def limited(p):
            async with sem:
                return await one_request(session, args, p)

        tasks = []
        start = time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.ensure_future(limited(p)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "concurrency": concurrency, "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:3], "duration_s": elapsed,
        "request_throughput": len(ok) / elapsed, "output_throughput": out_tokens / elapsed,
        "total_throughput": (out_tokens + in_tokens) / elapsed, "output_tokens": out_tokens,
        "ttft_ms": {k: v * 1e3 for k, v in percentiles([r.ttft for r in ok]).items()},
        "tpot_ms": {k: v * 1e3 for k, v in percentiles(tpot).items()},
        "itl_ms": {k: v * 1e3 for k, v in percentiles([x for r in ok for x in r.itl]).items()},
        "e2e_ms": {k: v * 1e3 for k, v in percentiles([r.e2e for r in ok]).items()},
    }


def print_table(label: str, results: list[dict]) -> None:
    print(f"\n{label}")
    head = (f"{'conc':>5} {'done':>5} {'fail':>4} {'req/s':>7} {'out tok/s':>10} {'tot tok/s':>10} "
            f"{'TTFT mean/med/p99 ms':>24} {'TPOT mean/med/p99 ms':>22} {'ITL med ms':>10} {'E2E med s':>9}")
    print(head)
    print("-" * len(head))
    for r in results:
        t, p, i, e = r["ttft_ms"], r["tpot_ms"], r["itl_ms"], r["e2e_ms"]
        print(f"{r['concurrency']:>5} {r['completed']:>5} {r['failed']:>4} {r['request_throughput']:>7.2f} "
              f"{r['output_throughput']:>10.1f} {r['total_throughput']:>10.1f} "
              f"{t['mean']:>8.0f}/{t['median']:>6.0f}/{t['p99']:>7.0f} {p['mean']:>7.1f}/{p['median']:>6.1f}/{p['p99']:>6.1f} "
              f"{i['median']:>10.1f} {e['median'] / 1e3:>9.2f}")
        for err in r["errors"]:
            print(f"      error: {err}")


def plot(results: list[dict], path: str, label: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: .venv/bin/pip install matplotlib") from None
    conc = [r["concurrency"] for r in results]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(conc, [r["output_throughput"] for r in results], "o-")
    a.set_xscale("log", base=2)
    a.set_xlabel("max concurrency")
    a.set_ylabel("output tokens/s")
    a.set_title(f"Throughput — {label}")
    for key, style in (("median", "o-"), ("p90", "s--"), ("p99", "^:")):
        b.plot(conc, [r["ttft_ms"][key] for r in results], style, label=f"TTFT {key}")
        b.plot(conc, [r["tpot_ms"][key] for r in results], style, label=f"TPOT {key}")
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xlabel("max concurrency")
    b.set_ylabel("ms")
    b.set_title("Latency percentiles")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    p.add_argument("--model", default=None, help="default: the server's first model")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset", default="random", choices=["random", "text"])
    p.add_argument("--vocab-size", type=int, default=49152, help="for random token ids")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--concurrency", default=None, help="comma-separated values: one pass each (overrides the above)")
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s, Poisson arrivals")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="server")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--plot", help="write a PNG here")
    args = p.parse_args()

    async def run() -> list[dict]:
        if args.model is None:
            async with aiohttp.ClientSession() as s, s.get(args.base_url + "/v1/models") as r:
                args.model = (await r.json())["data"][0]["id"]
        levels = [int(c) for c in args.concurrency.split(",")] if args.concurrency else [args.max_concurrency]
        # Fresh prompts for every pass: no server may serve a pass from the prefix cache of the last.
        return [await run_pass(args, make_prompts(args, random.Random(args.seed * 1000 + i)), c)
                for i, c in enumerate(levels)]

    results = asyncio.run(run())
    print_table(f"{args.label}: {args.num_prompts} prompts x ({args.input_len} in, {args.output_len} out), "
                f"{args.endpoint}, model {args.model}", results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "results": results}, f, indent=1,
                      default=str)
    if args.plot:
        plot(results, args.plot, args.label)


if __name__ == "__main__":
    main()
