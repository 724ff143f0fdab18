"""The CPU kernels are portable: the build assumes only x86-64-v3 (AVX2, FMA), and every
instruction above it (AVX-512, AVX-512-BF16, AMX) sits in a function of a path that runs only
where cpu_isa() found those instructions. A function of the baseline that used one of them would
kill the process with an illegal instruction on an AVX2 machine, and nothing here (AVX-512 and
AMX present) would notice; so this reads the compiled objects themselves (objdump) and names any
function outside the avx512 / amx paths that holds an EVEX-encoded (AVX-512) or tile instruction.
Inline functions and templates that a path instantiates are the usual way one slips out."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIRS = ("cpp/src/kernels/", "cpp/src/model/")
PATH_FUNCTION = re.compile(r"avx512|amx", re.IGNORECASE)  # namespaces, files and policy types of the paths
# An instruction line of `objdump -d --insn-width=16`: address, raw bytes, mnemonic and operands.
INSTRUCTION = re.compile(r"^\s*[0-9a-f]+:\t((?:[0-9a-f]{2} )+)\s*\t(.*)$")
LEGACY_PREFIXES = {"26", "2e", "36", "3e", "64", "65", "66", "67", "f2", "f3"}


def _kernel_objects() -> list[tuple[Path, str]]:
    """(object file, its compile command) of every kernel and model source in the most recent build
    that records its commands; empty when there is none."""
    builds = sorted((p for p in (ROOT / "build").glob("*/compile_commands.json")), key=lambda p: p.stat().st_mtime)
    if not builds:
        return []
    objects = []
    for entry in json.loads(builds[-1].read_text()):
        source = Path(entry["file"]).resolve()
        if not any(str(source).startswith(str(ROOT / d)) for d in KERNEL_DIRS):
            continue
        command = entry.get("command") or " ".join(entry["arguments"])
        obj = Path(entry["directory"]) / re.search(r"-o (\S+)", command).group(1)
        objects.append((obj, command))
    return objects


def _uses_above_baseline(raw: str, text: str) -> bool:
    """EVEX prefix (0x62 first, after any legacy prefixes: AVX-512) or an AMX tile instruction."""
    b = raw.split()
    while b and b[0] in LEGACY_PREFIXES:
        b = b[1:]
    return (bool(b) and b[0] == "62") or bool(re.match(r"(tile|tdp)", text))


def _functions_above_baseline(obj: Path) -> dict[str, str]:
    dump = subprocess.run(["objdump", "-d", "-C", "--insn-width=16", str(obj)], capture_output=True, text=True,
                          check=True).stdout
    found, function = {}, None
    for line in dump.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            function = head.group(1)
            continue
        ins = INSTRUCTION.match(line)
        if ins and function and function not in found and _uses_above_baseline(ins.group(1), ins.group(2)):
            found[function] = ins.group(2).strip()
    return found


OBJECTS = _kernel_objects()
needs_build = pytest.mark.skipif(not OBJECTS or shutil.which("objdump") is None,
                                 reason="needs a build with compile_commands.json (make build) and objdump")


@needs_build
def test_the_build_assumes_only_the_baseline():
    for obj, command in OBJECTS:
        assert "-march=native" not in command, f"{obj.name} is compiled for the build machine: {command}"
        assert re.search(r"-march=x86-64(-v3)?\b", command), f"{obj.name} has no baseline -march: {command}"


@needs_build
def test_only_the_paths_hold_avx512_or_amx_instructions():
    leaks, path_functions = [], 0
    for obj, _ in OBJECTS:
        for function, instruction in _functions_above_baseline(obj).items():
            if PATH_FUNCTION.search(function):
                path_functions += 1
            else:
                leaks.append(f"{obj.name}: {function[:160]} ({instruction})")
    assert not leaks, "instructions above x86-64-v3 outside the avx512/amx paths:\n" + "\n".join(leaks)
    assert path_functions > 0  # the check sees the paths' instructions at all
