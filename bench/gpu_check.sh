#!/usr/bin/env bash
# One call on a lent GPU machine (no network): build corellm with its CUDA module, run the CUDA
# tests, the CUDA kernel benchmark (bench/cuda_kernels.py) and the offline throughput benchmark on
# a random-weight Qwen3-0.6B-shaped model (256 requests, 100-1024 tokens in and out), write
# everything to $OUT. Each step is cut at STEP_TIMEOUT seconds (default 240). Run from the repository root:
#
#     OUT=/tmp/gpu_out bash bench/gpu_check.sh
#
# With the device tool: run `bash bench/gpu_prepare.sh` here first, and carry build/device-deps
# (OpenSSL's headers, used where the machine lacks them).
#
# Uses the machine's preinstalled torch, pybind11, scikit-build-core and pytest (no downloads:
# pip --no-build-isolation --no-deps). Each step's log is $OUT/<step>.log; $OUT/summary.txt has
# one line per step with its status and seconds. Exits non-zero when a step failed.
set -uo pipefail
OUT=${OUT:-/tmp/corellm_gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
status=0

step() {  # step NAME COMMAND...: runs it with its output in $OUT/NAME.log, records status and time
  local name=$1
  shift
  local start=$SECONDS
  if timeout "${STEP_TIMEOUT:-240}" "$@" >"$OUT/$name.log" 2>&1; then
    echo "ok    $name ($((SECONDS - start)) s)" | tee -a "$OUT/summary.txt"
  else
    echo "FAIL  $name ($((SECONDS - start)) s): see $name.log" | tee -a "$OUT/summary.txt"
    tail -20 "$OUT/$name.log"
    status=1
  fi
}

# OpenSSL's headers from bench/gpu_prepare.sh where the machine has the library but not them.
if [ ! -f /usr/include/openssl/evp.h ] && [ -d build/device-deps/openssl/include ]; then
  crypto=$(ls /usr/lib/x86_64-linux-gnu/libcrypto.so* 2>/dev/null | head -1)
  export CMAKE_ARGS="-DOPENSSL_INCLUDE_DIR=$PWD/build/device-deps/openssl/include -DOPENSSL_CRYPTO_LIBRARY=$crypto"
  echo "using carried OpenSSL headers with $crypto"
fi
: >"$OUT/summary.txt"
step machine bash -c "nvidia-smi; nvcc --version; $PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'"
step build env CORELLM_CUDA=ON $PY -m pip install -v --no-build-isolation --no-deps -e .
step import $PY -c "import corellm, corellm._cuda; print('corellm._cuda', sorted(n for n in dir(corellm._cuda) if not n.startswith('_')))"
step cuda_tests $PY -m pytest -q -rs tests/ops/test_cuda_ops.py tests/ops/test_cuda_sampler.py --junitxml="$OUT/cuda_tests.xml"
step cuda_engine_tests $PY -m pytest -q -rs tests/engine/test_cuda_engine.py tests/engine/test_cuda_graphs.py --junitxml="$OUT/cuda_engine_tests.xml"
step cpu_ops_tests $PY -m pytest -q tests/ops
step cuda_kernels_bench $PY bench/kernels.py --device cuda --json "$OUT/cuda_kernels.json"
step throughput_qwen3_0.6b $PY bench/throughput.py --device cuda --random-model qwen3-0.6b --num-prompts 256 \
  --input-len 100:1024 --output-len 100:1024 --max-num-batched-tokens 16384 --quiet --json "$OUT/throughput.json"
exit $status
