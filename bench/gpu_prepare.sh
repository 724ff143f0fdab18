#!/usr/bin/env bash
# Run here, before a device call: gathers what the GPU machine may lack and cannot download (it has
# no network) into build/device-deps/, for the call to carry (carry: ["build/device-deps"]):
#   - OpenSSL's headers and its libcrypto.so.3 (the native core hashes KV blocks with OpenSSL's
#     SHA-256; the GPU image has the library, maybe not its development headers).
#     bench/gpu_check.sh uses each only where the machine lacks its own.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=build/device-deps/openssl
rm -rf "$dest"
mkdir -p "$dest/include/openssl" "$dest/lib"
cp -r /usr/include/openssl/. "$dest/include/openssl/"
# Debian / Ubuntu keep the configuration headers under the multiarch folder.
if [ -d /usr/include/x86_64-linux-gnu/openssl ]; then cp -r /usr/include/x86_64-linux-gnu/openssl/. "$dest/include/openssl/"; fi
cp -L /usr/lib/x86_64-linux-gnu/libcrypto.so.3 "$dest/lib/"
du -sh build/device-deps
