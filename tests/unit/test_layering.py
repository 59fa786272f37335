"""The architecture as a test: contracts ← ctxfleet_client ← services ← workers ← infra, and curated public
names. The client distribution ships contracts and ctxfleet_client alone, so they import nothing above."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = {"contracts": 0, "ctxfleet_client": 1, "services": 2, "workers": 3, "infra": 4}
PACKAGES = ("contracts", "ctxfleet_client", "services", "workers", "infra")


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


def test_layering_the_client_imports_only_contracts_nats_and_pydantic() -> None:
    # Its distribution depends on nats-py and pydantic only; OpenTelemetry is used when the runtime has it.
    allowed = {"contracts", "ctxfleet_client", "nats", "pydantic", "opentelemetry", "__future__"}
    import sys

    stdlib = set(sys.stdlib_module_names)
    for path in sorted((ROOT / "ctxfleet_client").rglob("*.py")):
        framework = ADAPTER_FRAMEWORKS.get(path.stem, set()) if path.parent.name == "adapters" else set()
        foreign = {n for n in _imports(path) if n not in stdlib and n not in allowed | framework}
        assert foreign == set(), f"{path.name} imports {foreign}"


# Each framework adapter is an extra of the client distribution: it imports its framework, no other
# (LangGraph comes with LangChain, which is built on it).
ADAPTER_FRAMEWORKS = {
    "langchain": {"langchain", "langchain_core", "langgraph"},
    "langgraph": {"langchain_core", "langgraph"},
    "openai_agents": {"agents"},
    "pydantic_ai": {"pydantic_ai"},
}


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


# The pure core: no I/O, no clock, no randomness — only contracts, the core itself and the shared errors.
CORE_FORBIDDEN = {
    "asyncpg",
    "ctxfleet_client",
    "nats",
    "faststream",
    "urllib",
    "http",
    "socket",
    "subprocess",
    "time",
    "os",
    "uuid4",
}
CORE_MAY_IMPORT = {"contracts", "services.core"}


def _core_imports(path: Path) -> tuple[set[str], set[str]]:
    """(top-level modules and ``uuid4``/``time``-like names used,
    ``services.*``/``contracts`` modules imported)."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    internal: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.name.split(".")[0])
                if alias.name.split(".")[0] in ("services", "contracts"):
                    internal.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
            names.update(a.name for a in node.names if a.name == "uuid4")
            if node.module.split(".")[0] in ("services", "contracts"):
                internal.add(node.module)
        elif isinstance(node, ast.Attribute) and node.attr == "uuid4":
            names.add("uuid4")
    return names, internal


def test_the_core_does_no_io_and_imports_only_the_core_contracts_and_errors() -> None:
    offenders = []
    for path in sorted((ROOT / "services" / "core").rglob("*.py")):
        names, internal = _core_imports(path)
        offenders += [f"{path.relative_to(ROOT)} uses {n}" for n in sorted(names & CORE_FORBIDDEN)]
        offenders += [
            f"{path.relative_to(ROOT)} imports {m}"
            for m in sorted(internal)
            if not any(m == allowed or m.startswith(allowed + ".") for allowed in CORE_MAY_IMPORT)
        ]
    assert offenders == []


def test_services_top_level_holds_only_the_layers_and_the_shared_modules() -> None:
    top = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "services").iterdir()
        if p.suffix == ".py" or (p.is_dir() and p.name != "__pycache__")
    }
    assert top == {
        "__init__",
        "core",
        "store",
        "app",
        "edge",
        "settings",
        "killpoints",
        "tokenizer_data",
    }


# Within services: core ← store ← app, and edge (what drives a fleet through the client) beside app.
_MAY_USE = {
    "core": {"core"},
    "store": {"core", "store"},
    "app": {"core", "store", "app"},
    "edge": {"core", "edge"},
}


@pytest.mark.parametrize("layer", sorted(_MAY_USE))
def test_each_services_layer_imports_only_the_layers_below_it(layer: str) -> None:
    offenders = []
    for path in sorted((ROOT / "services" / layer).rglob("*.py")):
        _, internal = _core_imports(path)
        for module in internal:
            parts = module.split(".")
            if (
                parts[0] == "services"
                and len(parts) > 1
                and parts[1] in _MAY_USE
                and parts[1] not in _MAY_USE[layer]
            ):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []
