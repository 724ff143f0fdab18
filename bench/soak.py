"""Soak test: mixed traffic against a corellm server for --minutes, then a check that everything
came back to its baseline.

Traffic: --concurrency workers send back to back a random mix of /v1/completions and
/v1/chat/completions, streamed and whole, random prompt (8-300 words) and output (4-160 tokens)
lengths, random sampling settings, and --cancel-fraction of them (10 %) cancelled mid-way (a
dropped stream, or a client timeout for a whole response). A 429 counts as rejected; anything
else that is not a 200 (or a cancellation) counts as an error.

After --warmup-s of the same load, the baseline is taken, then the soak runs; baseline and end
(after the traffic stops and the server is idle again) are read from /metrics: resident memory, free KV blocks, open request states per layer, queued requests. The run
passes when there were no errors, free blocks and request states equal the baseline, RSS grew by
less than --rss-tolerance-mb (bounded caches fill during the first minutes) and by less than
32 MiB over the second half of the run (no steady leak). It starts its own server (`corellm serve` with --server-args)
unless --base-url is given.

    .venv/bin/python bench/soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from collections import Counter

import aiohttp

from server_process import free_port, wait_ready

LATE_RSS_TOLERANCE_MB = 32.0
WORDS = ("time river blue engine quiet market seven garden paper signal north bright window story metal cloud "
         "simple orange answer travel").split()


def read_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[re.sub(r'model_name="[^"]*",?', "", key).replace(",}", "}").replace("{}", "")] = float(value)
    return out


async def snapshot(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(base + "/metrics") as r:
        m = read_metrics(await r.text())
    snap = {"rss_mb": m.get("process_resident_memory_bytes", 0) / 2**20,
            "free_kv_blocks": m["corellm:kv_cache_free_blocks"],
            "queued": m["corellm:num_requests_queued"],
            "running": m["corellm:num_requests_running"], "waiting": m["corellm:num_requests_waiting"]}
    for key, value in m.items():
        if key.startswith("corellm:open_request_states"):
            snap["open:" + key.split('layer="')[1].rstrip('"}')] = value
    return snap


async def wait_idle(session, base: str, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        snap = await snapshot(session, base)
        busy = snap["running"] + snap["waiting"] + snap["queued"] + sum(v for k, v in snap.items() if k.startswith("open:"))
        if not busy or time.monotonic() > deadline:
            return snap
        await asyncio.sleep(0.1)


def make_request(rng: random.Random) -> tuple[str, dict]:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 300)))
    params = {"max_tokens": rng.randint(4, 160), "stream": rng.random() < 0.5,
              "temperature": rng.choice([0.0, 0.7, 1.0]), "top_p": rng.choice([1.0, 0.9]), "seed": rng.randrange(1000)}
    if rng.random() < 0.2:
        params["stop"] = [rng.choice(WORDS)]
    if rng.random() < 0.1:
        params["n"] = 2
    if rng.random() < 0.5:
        return "/v1/completions", {"prompt": words, **params}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": words}], **params}


async def one(session: aiohttp.ClientSession, base: str, rng: random.Random, cancel_fraction: float) -> str:
    path, body = make_request(rng)
    cancel = rng.random() < cancel_fraction
    timeout = aiohttp.ClientTimeout(total=rng.uniform(0.05, 1.0) if cancel else 600)
    try:
        async with session.post(base + path, json=body, timeout=timeout) as r:
            if r.status == 429:
                await r.read()
                return "rejected"
            if r.status != 200:
                return f"error {r.status}: {(await r.text())[:200]}"
            if body["stream"]:
                async for line in r.content:
                    if line.startswith(b'data: {"error"'):
                        return f"error in stream: {line[:200]!r}"
            else:
                await r.read()
            return "completed"
    except asyncio.TimeoutError:
        return "cancelled" if cancel else "error: timeout"
    except aiohttp.ClientError as e:
        return f"error: {type(e).__name__}: {e}"


async def traffic(session, base: str, args, seconds: float, seed: int, samples: list | None = None) -> dict:
    """--concurrency workers sending the mixed traffic for `seconds`; outcome counts and errors."""
    outcomes: Counter = Counter()
    errors: list[str] = []
    deadline = time.monotonic() + seconds

    async def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < deadline:
            outcome = await one(session, base, rng, args.cancel_fraction)
            kind = outcome.split(":")[0].split(" ")[0]
            outcomes[kind] += 1
            if kind == "error" and len(errors) < 20:
                errors.append(outcome)

    async def sampler() -> None:
        while samples is not None and time.monotonic() + 30 < deadline:
            await asyncio.sleep(30)
            samples.append({"t_s": round(seconds - (deadline - time.monotonic())), **(await snapshot(session, base))})

    await asyncio.gather(sampler(), *(worker(i) for i in range(args.concurrency)))
    return {"outcomes": dict(outcomes), "errors": errors}


async def soak(args) -> dict:
    base = args.base_url
    async with aiohttp.ClientSession() as session:
        started = await wait_idle(session, base)
        # Warm-up under the same load, so that the baseline holds what serving allocates once
        # (activation buffers for the largest batches, allocator arenas) and growth after it is a leak.
        await traffic(session, base, args, args.warmup_s, seed=args.seed + 1)
        start = await wait_idle(session, base)
        samples: list[dict] = []
        t0 = time.monotonic()
        result = await traffic(session, base, args, args.minutes * 60, seed=args.seed, samples=samples)
        elapsed = time.monotonic() - t0
        end = await wait_idle(session, base)
    return {"minutes": args.minutes, "elapsed_s": elapsed, **result, "before_warmup": started, "start": start,
            "end": end, "samples": samples}


def verdict(result: dict, rss_tolerance_mb: float) -> list[str]:
    start, end = result["start"], result["end"]
    problems = []
    if result["outcomes"].get("error"):
        problems.append(f"{result['outcomes']['error']} requests failed: {result['errors'][:3]}")
    for key in start:
        if key != "rss_mb" and start[key] != end[key]:
            problems.append(f"{key}: {start[key]:g} at the start, {end[key]:g} at the end")
    if end["rss_mb"] - start["rss_mb"] > rss_tolerance_mb:
        problems.append(f"RSS grew by {end['rss_mb'] - start['rss_mb']:.0f} MiB (tolerance {rss_tolerance_mb:g})")
    late = late_rss_growth(result)
    if late is not None and late > LATE_RSS_TOLERANCE_MB:
        problems.append(f"RSS still grew by {late:.0f} MiB over the second half of the run (a leak)")
    return problems


def late_rss_growth(result: dict) -> float | None:
    """RSS at the end minus RSS at the first sample past half the run."""
    half = result["minutes"] * 30
    mid = next((s for s in result["samples"] if s["t_s"] >= half), None)
    return None if mid is None else result["end"]["rss_mb"] - mid["rss_mb"]


def print_report(result: dict, problems: list[str]) -> None:
    o = result["outcomes"]
    total = sum(o.values())
    print(f"\nsoak: {result['elapsed_s'] / 60:.1f} min, {total} requests "
          f"({total / result['elapsed_s']:.1f}/s): " + ", ".join(f"{k} {v}" for k, v in sorted(o.items())))
    print("\n| figure | before warm-up | start (after warm-up) | end |\n|---|---|---|---|")
    for key in result["start"]:
        print(f"| {key} | {result['before_warmup'][key]:g} | {result['start'][key]:g} | {result['end'][key]:g} |")
    if result["samples"]:
        rss = [s["rss_mb"] for s in result["samples"]]
        print(f"\nRSS during the run: min {min(rss):.0f} MiB, max {max(rss):.0f} MiB over {len(rss)} samples "
              f"(every 30 s); growth over the second half: {late_rss_growth(result) or 0:+.0f} MiB")
    print("\nPASS: everything back to baseline" if not problems else "\nFAIL:\n  " + "\n  ".join(problems))


def start_server(server_args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "corellm.cli", "serve", "--port", str(port), *shlex.split(server_args)]
    proc = subprocess.Popen(cmd, env={**os.environ, "TQDM_DISABLE": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
    except RuntimeError as e:
        proc.kill()
        raise SystemExit(f"the server did not start: {e}") from None
    return proc, url


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--base-url", default=None, help="an already running server (default: start one)")
    p.add_argument("--server-args", default="--max-model-len 1024 --max-num-seqs 32",
                   help="arguments for the server this script starts")
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--warmup-s", type=float, default=60.0, help="load before the baseline is taken")
    p.add_argument("--cancel-fraction", type=float, default=0.1)
    p.add_argument("--rss-tolerance-mb", type=float, default=160.0,
                   help="allowed RSS growth from the baseline: the oneDNN shape caches fill up to ~140 MiB")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    proc = None
    if args.base_url is None:
        proc, args.base_url = start_server(args.server_args)
    try:
        result = asyncio.run(soak(args))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    problems = verdict(result, args.rss_tolerance_mb)
    result["problems"] = problems
    print_report(result, problems)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
