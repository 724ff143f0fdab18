#!/usr/bin/env bash
# Run here, before a device call: gathers what the GPU machine may lack and cannot download (it has
# no network) into build/device-deps/, for the call to carry (carry: ["build/device-deps"]).
#   - OpenSSL's headers (the native core hashes KV blocks with OpenSSL's SHA-256; the GPU image has
#     the libcrypto library but may lack its development headers). bench/gpu_check.sh uses them only
#     where /usr/include/openssl/evp.h is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build/device-deps/openssl/include/openssl
rm -rf build/device-deps/openssl
mkdir -p "$dest"
cp -r /usr/include/openssl/. "$dest/"
# Debian / Ubuntu keep the configuration headers under the multiarch folder.
if [ -d /usr/include/x86_64-linux-gnu/openssl ]; then cp -r /usr/include/x86_64-linux-gnu/openssl/. "$dest/"; fi
du -sh build/device-deps
