"""Servers started as subprocesses on free loopback ports, for the benchmarks: the port, waiting
until a server's /health answers 200 (or it exits), and bench/serve.py run against several
servers level by level (compare_llamacpp.py, compare_vllm.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 300, poll_s: float = 0.3) -> None:
    """Returns once url/health answers 200 (asked every poll_s while it does not answer); RuntimeError
    if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(poll_s)
    raise RuntimeError("server not ready")


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by pid and every process descended from it (vLLM's
    API server runs its engine in a child process), read from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, cpu seconds)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        stats[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, grew = {pid}, True
    while grew:
        more = {p for p, (parent, _) in stats.items() if parent in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(stats[p][1] for p in tree if p in stats)


def wait_quiet(procs: dict[str, subprocess.Popen], busy_cores: float = 0.05, window_s: float = 2.0,
               timeout: float = 120) -> None:
    """Returns once every server has used under busy_cores of a core over one window_s (after
    timeout, with a warning): a server's own work after /health answers (corellm commits its KV
    cache's pages on a background thread while its engine is idle: ~5 s for 2 GiB on this VM) then
    does not run beside another server's measured level."""
    deadline = time.monotonic() + timeout
    before = {name: process_tree_cpu_s(proc.pid) for name, proc in procs.items()}
    busy: dict[str, float] = {}
    while time.monotonic() < deadline:
        time.sleep(window_s)
        now = {name: process_tree_cpu_s(proc.pid) for name, proc in procs.items()}
        busy = {name: (now[name] - before[name]) / window_s for name in procs}
        if all(cores < busy_cores for cores in busy.values()):
            return
        before = now
    print(f"warning: servers still busy after {timeout:.0f} s (cores used: {busy}); measuring anyway", flush=True)


def serve_both(servers: dict[str, list[str]], ports: dict[str, int], args, out_dir: Path,
               envs: dict[str, dict[str, str]] | None = None, ready_timeout: float = 300,
               startup_s: dict[str, float] | None = None, rounds: int = 1,
               models: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """Starts the servers one after another (each waited for before the next starts, so that no
    start-up competes with another; its seconds from exec to /health 200 go into startup_s), waits
    until none is busy (wait_quiet), then for each concurrency level runs bench/serve.py against
    each server in turn with the same prompts (fresh ones per level: no prefix-cache hits across
    levels), so that all meet the VM in the same state for a level; `rounds` times over, each
    server's best round kept per level (this VM's speed drifts by a third within minutes). args:
    concurrency ("1,4,16"), num_prompts, input_len, output_len; envs: a server's environment, if not
    this one's; models: the `model` a server's requests name, if not its first (a LoRA adapter);
    each server's log goes to out_dir/<name>.log."""
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = {name: open(out_dir / f"{name}.log", "w") for name in servers}
    procs: dict[str, subprocess.Popen] = {}
    levels = args.concurrency.split(",")
    best: dict[str, list[dict | None]] = {name: [None] * len(levels) for name in servers}
    try:
        for name, cmd in servers.items():
            started = time.monotonic()
            procs[name] = subprocess.Popen(cmd, stdout=logs[name], stderr=subprocess.STDOUT,
                                           env=(envs or {}).get(name))
            wait_ready(f"http://127.0.0.1:{ports[name]}", procs[name], timeout=ready_timeout)
            if startup_s is not None:
                startup_s[name] = time.monotonic() - started
        wait_quiet(procs)
        for round_ in range(rounds):
            for level, conc in enumerate(levels):
                for name in servers:
                    out = out_dir / f"serve-{name}-{conc}.json"
                    subprocess.run([sys.executable, str(Path(__file__).parent / "serve.py"),
                                    "--base-url", f"http://127.0.0.1:{ports[name]}",
                                    "--num-prompts", str(args.num_prompts), "--concurrency", conc,
                                    "--seed", str(round_ * len(levels) + level), "--input-len", str(args.input_len),
                                    "--output-len", str(args.output_len), "--label", name, "--json", str(out),
                                    *(["--model", models[name]] if models and name in models else [])],
                                   check=True)
                    result = json.loads(out.read_text())["results"][0]
                    kept = best[name][level]
                    if kept is None or result["output_throughput"] > kept["output_throughput"]:
                        best[name][level] = result
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.wait(timeout=60)
        for log in logs.values():
            log.close()
    return best


def print_serving_table(corellm: list[dict], peer: list[dict], peer_name: str) -> None:
    """One row per concurrency: output tok/s of both, corellm / peer, median TTFT and TPOT."""
    print(f"\n{'serving':<12} {'out tok/s corellm':>18} {peer_name:>13} {'ratio':>7} {'TTFT med ms c/p':>18} "
          f"{'TPOT med ms c/p':>18}")
    for c, p in zip(corellm, peer):
        print(f"conc {c['concurrency']:<7} {c['output_throughput']:>18.1f} {p['output_throughput']:>13.1f} "
              f"{c['output_throughput'] / max(p['output_throughput'], 1e-9):>6.2f}x "
              f"{c['ttft_ms']['median']:>8.0f}/{p['ttft_ms']['median']:<8.0f} "
              f"{c['tpot_ms']['median']:>8.1f}/{p['tpot_ms']['median']:<8.1f}")
