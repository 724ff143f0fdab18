#!/usr/bin/env bash
# Which C++ compiler, and which of its settings, builds extensions whose exceptions work: on the
# GPU image, corellm built with its /opt/gcc g++ died (SIGSEGV) on the first C++ exception any
# check threw (a ValueError in Python), in _core and _cuda alike, so every error path crashed.
#
#     bash bench/cxx_probe.sh PYTHON    # prints "COMPILER|CXXFLAGS|LDFLAGS|CMAKE_ARGS" (the last three may be empty)
#
# For each candidate ($CXX, the g++ on PATH, the system's g++ / g++-14 / -13 / -12, clang++) it
# builds, with CMake and pybind11_add_module as corellm's modules are built, a module whose two
# functions throw (std::invalid_argument directly; corellm::InvalidArgument through check.h from a
# static library linked with OpenMP, as the engine's checks), imports it into PYTHON after torch,
# asks for AMX permission (as corellm does at import, on a CPU with AMX) and checks that Python
# gets a ValueError from each. Ways, in order: lazy binding (a diagnosis, never chosen); as built
# (Release: -O3, -fvisibility=hidden, pybind11's LTO when the toolchain has it, stripped after the
# link, bound at load: -z now); unstripped (CMAKE_STRIP=true); without link-time optimization (which
# pybind11 leaves to CMAKE_INTERPROCEDURAL_OPTIMIZATION when it is set); CET-marked objects
# (-fcf-protection=full); libgcc and libstdc++ linked statically. The first that passes is printed;
# what each did goes to stderr. Exit status 1 when none passes.
#
# On the GPU image (2026-12-04) probes without the AMX request passed while corellm's own modules,
# whose process holds AMX permission, crashed on their first exception.
set -uo pipefail
PY=$(command -v "${1:-python3}") || { echo "cxx_probe: no ${1:-python3}" >&2; exit 1; }
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")  # absolute (the probes run in their folders), links kept
work=$(mktemp -d /tmp/cxx_probe.XXXX)
trap 'rm -rf "$work"' EXIT
repo=$(cd "$(dirname "$0")/.." && pwd)
# The module: fail() throws std::invalid_argument itself; fail_checked() calls into a static
# library that throws corellm::InvalidArgument through check.h, as the engine's checks do (the
# library linked with OpenMP, as corellm's kernels are).
cat >"$work/probe.cpp" <<'EOF'
#include <pybind11/pybind11.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdexcept>
int probe_check_positive(int value);
PYBIND11_MODULE(cxx_probe, m) {
  m.def("fail", [](int value) -> int { throw std::invalid_argument("probe value " + std::to_string(value)); });
  m.def("fail_checked", [](int value) { return probe_check_positive(value); });
  // As corellm's cpu_isa.cpp does at import on a CPU with AMX: ARCH_REQ_XCOMP_PERM for XTILEDATA.
  m.def("request_amx", []() { return syscall(SYS_arch_prctl, 0x1023, 18) == 0; });
}
EOF
cat >"$work/check.cpp" <<'EOF'
#include "corellm/check.h"
int probe_check_positive(int value) {
  CORELLM_CHECK_ARG(value > 0, "probe value must be > 0, got ", value);
  return value;
}
EOF
candidates=()
for cxx in "${CXX:-}" "$(command -v g++ 2>/dev/null)" /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12 \
           "$(command -v clang++ 2>/dev/null)"; do
  [ -n "$cxx" ] && [ -x "$cxx" ] || continue
  real=$(readlink -f "$cxx")
  [[ " ${candidates[*]-} " == *" $real "* ]] || candidates+=("$real")
done
cat >"$work/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.18)
project(cxx_probe LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_EXTENSIONS OFF)
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
set(CMAKE_CXX_FLAGS_RELEASE "-O3 -DNDEBUG")
set(PYBIND11_FINDPYTHON ON)
find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
find_package(pybind11 CONFIG REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
add_library(probe_check STATIC check.cpp)
target_include_directories(probe_check PUBLIC ${CORELLM_INCLUDE})
target_link_libraries(probe_check PUBLIC OpenMP::OpenMP_CXX)
pybind11_add_module(cxx_probe probe.cpp)
target_link_libraries(cxx_probe PRIVATE probe_check)
EOF
pybind11_dir=$("$PY" -m pybind11 --cmakedir 2>/dev/null) || { echo "cxx_probe: $PY has no pybind11" >&2; exit 1; }
true_cmd=$(command -v true)
# A way to build: its name, CXXFLAGS, LDFLAGS and the CMake arguments. The first, lazy binding
# (corellm's modules before 2026-12-04), is a diagnosis only, never chosen: whether it fails where
# the next, as built (-z now), passes.
ways=("lazy binding (diagnosis)|||"
      "as built||-Wl,-z,now|"
      "unstripped||-Wl,-z,now|-DCMAKE_STRIP=$true_cmd"
      "no LTO||-Wl,-z,now|-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF"
      "CET-marked (shadow stack)|-fcf-protection=full|-Wl,-z,now|"
      "static runtime||-Wl,-z,now -static-libgcc -static-libstdc++|")
n=0
for cxx in "${candidates[@]}"; do
  for way in "${ways[@]}"; do
    IFS='|' read -r name cxxflags ldflags cmake_args <<<"$way"
    n=$((n + 1))
    dir=$work/build$n
    # shellcheck disable=SC2086 # the CMake arguments are a word list
    if ! (CXXFLAGS=$cxxflags LDFLAGS=$ldflags CXX=$cxx cmake -S "$work" -B "$dir" -G Ninja \
          -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" -Dpybind11_DIR="$pybind11_dir" \
          -DCORELLM_INCLUDE="$repo/cpp/include" $cmake_args && cmake --build "$dir") >"$dir.log" 2>&1; then
      echo "cxx_probe: $cxx, $name: does not build the probe: $(tail -c 300 "$dir.log")" >&2
      continue
    fi
    failed=0
    for call in "fail(7)" "fail_checked(-7)"; do
      out=$(cd "$dir" && "$PY" -c "
import torch
import cxx_probe
amx = cxx_probe.request_amx()
try:
    cxx_probe.$call
except ValueError as e:
    print('ValueError (AMX permission %s):' % ('held' if amx else 'not held'), e)" 2>&1)
      rc=$?
      echo "cxx_probe: $cxx, $name, $call: exit $rc: $(echo "$out" | tail -1)" >&2
      [ "$rc" -eq 0 ] || failed=1
    done
    if [ "$failed" -eq 0 ] && [[ "$name" != *diagnosis* ]]; then
      echo "$cxx|$cxxflags|$ldflags|$cmake_args"
      exit 0
    fi
  done
done
exit 1
