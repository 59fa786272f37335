"""Code generators build usable request types from the schemas, and the types compile.

Two mainstream generators, called as a runtime author would: datamodel-code-generator (Python,
pydantic) and json-schema-to-typescript (TypeScript, then ``tsc --strict``). A request that came out as a
union of anonymous one-property types, ``any`` or a map where the wire fixes a shape fails here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from contracts import PrepareRequest, ReadRequest
from infra.schemas import write_schemas
from services.settings import Settings
from tests.fixtures.node import installed_node_packages
from workers.replies import parse_body

NODE_DIR = Path(__file__).resolve().parents[1] / "node"


@pytest.fixture(scope="module")
def schemas(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("schemas")
    write_schemas(out, Settings(nats_url="nats://127.0.0.1:4222"))
    return out


def _generated_module(schema: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The pydantic module datamodel-code-generator writes for ``schema``, imported."""
    target = out / f"{schema.name.split('.')[0].lower()}_generated.py"
    generate = [
        sys.executable,
        "-m",
        "datamodel_code_generator",
        "--input",
        str(schema),
        "--input-file-type",
        "jsonschema",
        "--output-model-type",
        "pydantic_v2.BaseModel",
        "--formatters",
        "builtin",
        # Enum defaults are written as the members' values; as Literal types they stay valid defaults.
        "--enum-field-as-literal",
        "all",
        "--output",
        str(target),
    ]
    done = subprocess.run(generate, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # Its hint when types had to be numbered apart (TaskBudget1…): names the schemas should have given.
    assert "collision" not in done.stderr
    spec = importlib.util.spec_from_file_location(target.stem, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Pydantic resolves a generic's module by name (RootModel[...]), so the module must be registered.
    monkeypatch.setitem(sys.modules, target.stem, module)
    spec.loader.exec_module(module)
    return module


def test_datamodel_code_generator_builds_a_prepare_request_the_fleet_accepts(
    schemas: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = _generated_module(schemas / "PrepareRequest.schema.json", tmp_path, monkeypatch)
    request = generated.PrepareRequest(
        session_id="s1",
        run_id="r1",
        instance_id="main",
        format="anthropic.messages",
        profile=generated.ModelProfile(name="m", context_window=16_000, output_reserve=1_000),
        tools=[generated.ToolSchema(name="read", parameters={"type": "object"})],
    )
    # One class with every field, not a union of anonymous one-property models.
    assert {"session_id", "profile", "budget_tokens", "tools"} <= set(generated.PrepareRequest.model_fields)
    sent = request.model_dump_json(exclude_none=True).encode()
    assert parse_body(PrepareRequest, sent).profile is not None


def test_datamodel_code_generator_builds_a_line_range_read_request(
    schemas: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = _generated_module(schemas / "ReadRequest.schema.json", tmp_path, monkeypatch)
    request = generated.ReadRequest(session_id="s1", ref="ctx://record/r1.main/2", line=3, lines=10)
    read = parse_body(ReadRequest, request.model_dump_json(exclude_none=True).encode())
    assert (read.line, read.lines) == (3, 10)


def test_datamodel_code_generator_discriminates_events_on_their_kind(
    schemas: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generated = _generated_module(schemas / "Event.schema.json", tmp_path, monkeypatch)
    body = {
        "session_id": "s1",
        "run_id": "r1",
        "instance_id": "main",
        "event_key": "e1",
        "kind": "tool_outcome",
        "payload": {"call_id": "c1", "status": "success", "text": "ok"},
    }
    event = generated.Event.model_validate_json(json.dumps(body))
    assert type(event.root).__name__ == "ToolOutcomeEvent"


def test_json_schema_to_typescript_request_types_compile_under_tsc_strict(
    schemas: Path, tmp_path: Path
) -> None:
    node = installed_node_packages(NODE_DIR)
    types = tmp_path / "types"
    generate = ["node", str(node / "generate_types.mjs"), str(schemas), str(types)]
    done = subprocess.run(generate, cwd=node, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # A request a generator splits into a union of anonymous types gets numbered helper types.
    assert "PrepareRequest1" not in (types / "PrepareRequest.ts").read_text()
    (types / "requests.ts").write_text((node / "requests.ts").read_text())
    tsc = [
        str(node / "node_modules" / ".bin" / "tsc"),
        "--strict",
        "--noEmit",
        "--target",
        "es2022",
        "--module",
        "esnext",
        "--moduleResolution",
        "bundler",
        str(types / "requests.ts"),
    ]
    compiled = subprocess.run(tsc, cwd=node, capture_output=True, text=True, timeout=120)
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
