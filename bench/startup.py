"""Start-up: seconds from exec to the first /health 200, for `corellm serve` with the default model
(as `make serve` starts it: its weight cache made beforehand) and for llama.cpp's llama-server on
the same GGUF file, the same number of threads, one after the other, --rounds times each
(alternating; /health asked every 10 ms). corellm's time is split by its log: up to its first line
(the interpreter and the imports, torch's above all), then the engine (tokenizer, weights, KV
cache), then up to /health answering.

    .venv/bin/python bench/startup.py --rounds 8

llama-server is built by bench/compare_llamacpp.py's build (once, minutes); --no-peer skips it."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from server_process import free_port, wait_ready


def log_lines(log: Path, since: float) -> list[tuple[float, str]]:
    """Each timestamped line of a corellm log: (its seconds after `since`, a time.time(), its text)."""
    out = []
    for line in log.read_text().splitlines():
        try:
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        out.append((stamp - since, line[24:]))
    return out


def time_start(cmd: list[str], port: int, log: Path) -> tuple[float, float]:
    """(exec to /health 200, the time.time() at exec) of one start of cmd, which is then stopped."""
    with open(log, "w") as out:
        wall, started = time.time(), time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc, timeout=120, poll_s=0.01)
            return time.monotonic() - started, wall
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def summary(values: list[float]) -> str:
    return f"{min(values):>6.2f} {statistics.median(values):>7.2f} {max(values):>6.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--no-peer", action="store_true", help="corellm only (no llama-server build or runs)")
    p.add_argument("--json", help="write every time here")
    args = p.parse_args()

    from corellm.model import load_model
    from corellm.model.loader import default_model_path

    load_model(progress=False)  # the weight cache, as `make serve` makes it before serving
    model = default_model_path()
    llama_server = None
    if not args.no_peer:
        from compare_llamacpp import build_llamacpp

        llama_server = build_llamacpp() / "llama-server"
    corellm_bin = Path(sys.executable).parent / "corellm"
    times: dict[str, list[float]] = {"corellm": [], "llama-server": []}
    phases: dict[str, list[float]] = {"imports": [], "engine": [], "to /health": []}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "server.log"
        for _ in range(args.rounds):
            port = free_port()
            total, wall = time_start([str(corellm_bin), "serve", "--port", str(port)], port, log)
            times["corellm"].append(total)
            lines = log_lines(log, wall)  # the first says the kernels; "serving ..." once listening
            serving = next(at for at, text in lines if "serving" in text)
            phases["imports"].append(lines[0][0])
            phases["engine"].append(serving - lines[0][0])
            phases["to /health"].append(total - serving)
            if llama_server is not None:
                port = free_port()
                total, _ = time_start([str(llama_server), "-m", str(model), "-t", str(args.threads), "--host",
                                       "127.0.0.1", "--port", str(port)], port, log)
                times["llama-server"].append(total)

    from corellm.native import cpu_kernel_path

    print(f"\nstart-up, exec to /health 200 (s), {args.rounds} rounds, {model.name}; "
          f"corellm's kernels: {cpu_kernel_path()}")
    print(f"{'':<26} {'min':>6} {'median':>7} {'max':>6}")
    print(f"{'corellm serve':<26} {summary(times['corellm'])}")
    for name, values in phases.items():
        print(f"{'  ' + name:<26} {summary(values)}")
    if times["llama-server"]:
        print(f"{'llama-server':<26} {summary(times['llama-server'])}")
        ratio = statistics.median(times["corellm"]) / statistics.median(times["llama-server"])
        print(f"corellm / llama-server (median): {ratio:.2f}x the time")
    if args.json:
        Path(args.json).write_text(json.dumps({"times": times, "corellm_phases": phases}, indent=1))


if __name__ == "__main__":
    main()
