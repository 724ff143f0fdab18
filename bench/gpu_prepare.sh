#!/usr/bin/env bash
# Run here, before a device call: gathers what the GPU machine may lack and cannot download (it has
# no network) into build/device-deps/, for the call to carry (carry: ["build/device-deps"]):
#   - OpenSSL's headers and its libcrypto.so.3 (the native core hashes KV blocks with OpenSSL's
#     SHA-256; the GPU image has the library, maybe not its development headers).
#     bench/gpu_check.sh uses each only where the machine lacks its own.
#   - the wheels of the Python packages corellm needs that the GPU image lacks (gguf, pure Python,
#     which the model loader imports: its numpy, pyyaml, requests and tqdm are in the image;
#     llguidance, for structured output: abi3 wheels, any CPython >= 3.9; nvidia-cutlass, whose
#     headers build the scaled fp8 / int8 GEMMs), installed there with pip --no-index --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build/device-deps/openssl
rm -rf "$dest"
mkdir -p "$dest/include/openssl" "$dest/lib"
cp -r /usr/include/openssl/. "$dest/include/openssl/"
# Debian / Ubuntu keep the configuration headers under the multiarch folder.
if [ -d /usr/include/x86_64-linux-gnu/openssl ]; then cp -r /usr/include/x86_64-linux-gnu/openssl/. "$dest/include/openssl/"; fi
cp -L /usr/lib/x86_64-linux-gnu/libcrypto.so.3 "$dest/lib/"
rm -rf build/device-deps/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  -d build/device-deps/wheels "gguf>=0.10" "llguidance>=1.9,<2" "nvidia-cutlass==$(sed -n 's/^CUTLASS_VERSION := //p' Makefile)"
du -sh build/device-deps
