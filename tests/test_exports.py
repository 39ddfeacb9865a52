"""The curated public surface: every name in ``__all__`` exists, and nothing private leaks."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("package", ["bus", "agents", "registry", "bus.transport"])
def test_all_is_exact(package: str) -> None:
    module = importlib.import_module(package)
    exported = module.__all__
    assert sorted(exported) == sorted(set(exported))
    for name in exported:
        assert hasattr(module, name), name
        assert not name.startswith("_")


PURE = ["canonical", "envelope", "errors", "ids", "keys", "signing", "subjects", "trust"]
IO_MODULES = {"asyncio", "socket", "subprocess", "nats", "os.path", "pathlib", "cryptography"}


@pytest.mark.parametrize("name", PURE)
def test_pure_core_imports_no_io(name: str) -> None:
    """The pure core (ARCHITECTURE.md layer 1) imports no I/O and only pure siblings."""
    source = (Path(__file__).parents[1] / "bus" / f"{name}.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert (node.module or "") in PURE, f"{name} imports .{node.module}"
                continue
            names = [node.module or ""]
        else:
            continue
        for n in names:
            assert n.split(".")[0] not in IO_MODULES, f"{name} imports {n}"


def test_lower_layers_never_import_upper_ones() -> None:
    code = (
        "import sys, bus, registry; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'agents'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
