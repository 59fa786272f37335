"""The architecture as a test: contracts ← services ← workers ← infra, and curated public names."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"contracts": 0, "services": 1, "workers": 2, "infra": 3}
PACKAGES = ("contracts", "services", "workers", "infra")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_layering_no_module_imports_a_higher_layer(package: str) -> None:
    own = LAYERS[package]
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in _imports(path)
        if name in LAYERS and LAYERS[name] > own
    ]
    assert offenders == []


def test_layering_contracts_import_only_stdlib_and_pydantic() -> None:
    allowed = {"pydantic", "__future__", "contracts"}
    import sys

    stdlib = set(sys.stdlib_module_names)
    for path in sorted((ROOT / "contracts").rglob("*.py")):
        foreign = {n for n in _imports(path) if n not in stdlib and n not in allowed}
        assert foreign == set(), f"{path.name} imports {foreign}"


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            names.append(".".join(parts))
    return names


def _public_definitions(module_name: str) -> set[str]:
    path = ROOT / (module_name.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT / module_name.replace(".", "/") / "__init__.py"
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_") and n not in {"log", "pytestmark"}}


@pytest.mark.parametrize("module_name", _modules())
def test_every_module_all_lists_exactly_its_public_definitions(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert hasattr(module, "__all__"), f"{module_name} has no __all__"
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert missing == []
    unlisted = sorted(_public_definitions(module_name) - set(module.__all__))
    assert unlisted == [], f"{module_name} defines public names not in __all__"
