"""The typed stub _core.pyi names exactly what the native module provides."""

from __future__ import annotations

import ast
from pathlib import Path

import corellm
from corellm import _core


def test_stub_matches_module() -> None:
    stub = Path(corellm.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    stub_classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    module_classes = {n for n in dir(_core) if isinstance(getattr(_core, n), type)}
    assert set(stub_classes) == module_classes - {"pybind11_object"} | set()
    for name, node in stub_classes.items():
        members = set()
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and not item.name.startswith("__"):
                members.add(item.name)
            elif isinstance(item, ast.AnnAssign):
                members.add(item.target.id)
            elif isinstance(item, ast.Assign):
                members.update(t.id for t in item.targets)
        missing = {m for m in members if not hasattr(getattr(_core, name), m)}
        assert not missing, f"{name}: the stub names {missing}, the module does not have them"
