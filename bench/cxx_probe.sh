#!/usr/bin/env bash
# Which C++ compiler, and which of its settings, builds extensions whose exceptions work: on the
# GPU image, corellm built with its /opt/gcc g++ died (SIGSEGV) on the first C++ exception any
# check threw (a ValueError in Python), in _core and _cuda alike, so every error path crashed.
#
#     bash bench/cxx_probe.sh PYTHON    # prints "COMPILER|LDFLAGS|CMAKE_ARGS" (the last two may be empty)
#
# For each candidate ($CXX, the g++ on PATH, the system's g++ / g++-14 / -13 / -12, clang++) it
# builds a one-function pybind11 module whose function throws std::invalid_argument, imports it
# into PYTHON after torch (as the engine does) and checks that Python gets the ValueError; three
# ways: as corellm's modules are built (-O3 -fvisibility=hidden, pybind11's -flto=auto, -fopenmp),
# without link-time optimization (CMAKE_ARGS -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF, which
# pybind11 respects), and with libgcc and libstdc++ linked statically (LDFLAGS). The first that
# passes is printed; what each did goes to stderr. Exit status 1 when none passes.
set -uo pipefail
PY=$(command -v "${1:-python3}") || { echo "cxx_probe: no ${1:-python3}" >&2; exit 1; }
PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")  # absolute (the probes run in their folders), links kept
work=$(mktemp -d /tmp/cxx_probe.XXXX)
trap 'rm -rf "$work"' EXIT
cat >"$work/probe.cpp" <<'EOF'
#include <pybind11/pybind11.h>
#include <stdexcept>
PYBIND11_MODULE(cxx_probe, m) {
  m.def("fail", [](int value) -> int { throw std::invalid_argument("probe value " + std::to_string(value)); });
}
EOF
includes=$("$PY" -m pybind11 --includes 2>/dev/null) || { echo "cxx_probe: $PY has no pybind11" >&2; exit 1; }
suffix=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
candidates=()
for cxx in "${CXX:-}" "$(command -v g++ 2>/dev/null)" /usr/bin/g++ /usr/bin/g++-14 /usr/bin/g++-13 /usr/bin/g++-12 \
           "$(command -v clang++ 2>/dev/null)"; do
  [ -n "$cxx" ] && [ -x "$cxx" ] || continue
  real=$(readlink -f "$cxx")
  [[ " ${candidates[*]-} " == *" $real "* ]] || candidates+=("$real")
done
# A way to build: its name, the compile-and-link flags, the LDFLAGS and CMAKE_ARGS that give the same.
ways=("as built|-flto=auto -fno-fat-lto-objects||"
      "no LTO|||-DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF"
      "static runtime|-flto=auto -fno-fat-lto-objects|-static-libgcc -static-libstdc++|")
n=0
for cxx in "${candidates[@]}"; do
  for way in "${ways[@]}"; do
    IFS='|' read -r name flags ldflags cmake_args <<<"$way"
    n=$((n + 1))
    dir=$work/$n
    mkdir -p "$dir"
    # shellcheck disable=SC2086 # the include and link flags are word lists
    if ! "$cxx" -O3 -fPIC -shared -fvisibility=hidden -fopenmp -std=c++17 $includes $flags $ldflags \
        "$work/probe.cpp" -o "$dir/cxx_probe$suffix" 2>"$dir/compile.log"; then
      echo "cxx_probe: $cxx, $name: does not compile the probe: $(tail -c 300 "$dir/compile.log")" >&2
      continue
    fi
    passed=1
    for first in "import torch" "pass"; do
      out=$(cd "$dir" && "$PY" -c "
$first
import cxx_probe
try:
    cxx_probe.fail(7)
except ValueError as e:
    print('ValueError:', e)" 2>&1)
      rc=$?
      echo "cxx_probe: $cxx, $name, after '$first': exit $rc: $(echo "$out" | tail -1)" >&2
      [ "$first" = "import torch" ] && passed=$rc
    done
    if [ "$passed" -eq 0 ]; then
      echo "$cxx|$ldflags|$cmake_args"
      exit 0
    fi
  done
done
exit 1
