"""The TypeScript client (clients/typescript): built with ``tsc --strict``, its types what the schemas
generate, its own tests, the README's quick start, and its replay of a bundled trace against a fleet."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from infra.embedded import free_port
from infra.schemas import write_schemas
from services.settings import Settings
from tests.fixtures.node import compiled

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
StartFleet = Callable[..., Awaitable[Any]]
TRACE = ROOT / "infra" / "samples" / "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl"


@pytest.fixture(scope="session")
def ts_package() -> Path:
    """clients/typescript with its locked packages installed (npm ci) and built (tsc --strict)."""
    return compiled(PACKAGE)


def test_typescript_types_hold_requests_to_the_schemas_rules(ts_package: Path) -> None:
    """test/wire-types.ts: a profile that is not a model profile, a prepare without a session, a payload
    of another kind and an unknown field do not compile (each line is marked @ts-expect-error, so one
    that compiled fails)."""
    checked = subprocess.run(
        ["node", "node_modules/typescript/bin/tsc", "-p", "tsconfig.test.json"],
        cwd=ts_package,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_typescript_client_tests_pass_without_a_fleet(ts_package: Path) -> None:
    """clients/typescript/test: fromEnv's parsing, the context tools' mapping, each provider's call shape."""
    tests = subprocess.run(
        ["node", "--test", "test/"], cwd=ts_package, capture_output=True, text=True, timeout=120
    )
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr
    assert "# fail 0" in tests.stdout


def test_typescript_wire_types_are_what_the_schemas_generate(ts_package: Path, tmp_path: Path) -> None:
    schemas = tmp_path / "schemas"
    write_schemas(schemas, Settings(nats_url="nats://127.0.0.1:4222"))
    check = subprocess.run(
        ["node", "scripts/generate.mjs", str(schemas), "--check"],
        cwd=ts_package,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stderr


def test_typescript_generator_check_fails_when_a_schema_changes(ts_package: Path, tmp_path: Path) -> None:
    schemas = tmp_path / "schemas"
    write_schemas(schemas, Settings(nats_url="nats://127.0.0.1:4222"))
    path = schemas / "ReadReply.schema.json"
    schema = json.loads(path.read_text())
    schema["properties"]["added_field"] = {"type": "string"}
    path.write_text(json.dumps(schema))
    check = subprocess.run(
        ["node", "scripts/generate.mjs", str(schemas), "--check"],
        cwd=ts_package,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 1
    assert "npm run generate" in check.stderr


@pytest.fixture
def quick_start(ts_package: Path) -> Path:
    """The README's TypeScript quick start, compiled with tsc --strict: the folder with out/quick.js."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start in TypeScript", 1)[1]
    found = re.search(r"```ts\n(.*?)```", section, re.DOTALL)
    assert found is not None, "the README's TypeScript quick start has no ts block"
    assert len(found.group(1).splitlines()) <= 30
    # Inside the package, so that "ctxfleet-client" resolves to it (a package may import itself by name).
    work = ts_package / ".quickstart"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "quick.ts").write_text(found.group(1), encoding="utf-8")
    config = {
        "compilerOptions": {
            "target": "ES2022",
            "module": "NodeNext",
            "moduleResolution": "NodeNext",
            "strict": True,
            "types": ["node"],
            "rootDir": ".",
            "outDir": "out",
        },
        "include": ["quick.ts"],
    }
    (work / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
    tsc = ts_package / "node_modules" / "typescript" / "bin" / "tsc"
    built = subprocess.run(
        ["node", str(tsc), "-p", "."], cwd=work, capture_output=True, text=True, timeout=120
    )
    assert built.returncode == 0, f"{built.stdout}{built.stderr}"
    return work


@pytest.mark.anyio
@pytest.mark.pg
@pytest.mark.nats
async def test_the_readme_typescript_quick_start_compiles_strict_and_runs_against_a_fleet(
    quick_start: Path, start_fleet: StartFleet, streams: str
) -> None:
    await start_fleet()
    env = {**os.environ, "CTX_NATS_URL": streams, "CTX_TENANT": "default"}
    for name in ("CTX_NATS_USER", "CTX_NATS_PASSWORD"):
        env.pop(name, None)
    node = await asyncio.create_subprocess_exec(
        "node",
        "out/quick.js",
        cwd=quick_start,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), timeout=30)
    assert node.returncode == 0, f"{out.decode()}\n{err.decode()}"
    # Each block's kind and reason, then the roles of the Chat body: the instructions and the question.
    printed = out.decode().splitlines()
    assert printed[0].startswith("instruction ")
    assert printed[-1] == "[ 'system', 'user' ]"


@pytest.mark.anyio
@pytest.mark.pg
@pytest.mark.nats
async def test_typescript_client_replays_a_trace_in_three_formats_and_answers_the_context_tools(
    ts_package: Path, start_fleet: StartFleet, streams: str
) -> None:
    await start_fleet()
    # CTX_NATS_URL as `ctxfleet env` prints a cluster's, one node of it down: fromEnv splits it.
    env = {
        **os.environ,
        "CTX_NATS_URL": f"{streams}, nats://127.0.0.1:{free_port()}",
        "CTX_TENANT": "default",
    }
    for name in ("CTX_NATS_USER", "CTX_NATS_PASSWORD"):
        env.pop(name, None)
    node = await asyncio.create_subprocess_exec(
        "node",
        "dist/replay.js",
        str(TRACE),
        "8000",
        cwd=ts_package,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), timeout=90)
    assert node.returncode == 0, f"{out.decode()}\n{err.decode()}"
    report = json.loads(out.decode().strip().splitlines()[-1])
    assistant_messages = sum(1 for line in TRACE.read_text().splitlines() if '"assistant_message"' in line)
    # One prepare before every assistant message, and one after the context tools' outcomes.
    assert report["prepares"] == assistant_messages + 1
    assert report["steps"] == assistant_messages + 1
    assert set(report["formats"]) == {"openai.chat", "openai.responses", "anthropic.messages"}
    assert report["context_tools_in_every_body"] is True
    assert report["search_hits"] >= 1
    # Lines 1–2 asked as start_line/end_line, 64 bytes as offset/length; another session's ref refused.
    assert report["read_heads"][0].split(" ")[1:3] == ["lines", "1–2"]
    assert report["read_heads"][1].split(" ")[1:3] == ["bytes", "0–64"]
    assert report["refused"] == [None, None, "not_found"]
    assert report["outcomes_recorded"] is True
