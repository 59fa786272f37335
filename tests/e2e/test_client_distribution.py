"""The client distribution stands alone: its wheel, in a venv with nothing else of the project, drives
a running fleet through a bundled trace."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra import SAMPLES_DIR
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.nats, pytest.mark.pg]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = SAMPLES_DIR / "tau-bench__gpt-4o-airline_task024_trial0.jsonl"
# Prepares the sample asks for: one before each of its assistant messages.
SAMPLE_PREPARES = sum('"assistant_message"' in line for line in SAMPLE.read_text().splitlines())


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _install_client(tmp: Path) -> Path:
    """Build the wheel from a copy of clients/python (its links resolved, as an sdist holds them) and
    install it into a new venv; the venv's python."""
    source = tmp / "source"
    shutil.copytree(ROOT / "clients" / "python", source, ignore=shutil.ignore_patterns("__pycache__"))
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        source,
        "-w",
        tmp,
        cwd=tmp,
    )
    (wheel,) = tmp.glob("ctxfleet_client-*.whl")
    _run(sys.executable, "-m", "venv", tmp / "venv", cwd=tmp)
    python = tmp / "venv" / "bin" / "python"
    # Its dependencies come from the configured index, like any user's.
    _run(python, "-m", "pip", "install", "-q", wheel, cwd=tmp)
    return python


async def test_client_wheel_alone_replays_a_trace_against_a_running_fleet(
    fleet: Fleet, streams: str, tmp_path: Path
) -> None:
    python = await asyncio.to_thread(_install_client, tmp_path)
    installed = await asyncio.to_thread(_run, python, "-m", "pip", "list", "--format=json", cwd=tmp_path)
    names = {p["name"].lower() for p in json.loads(installed)}
    assert "ctxfleet-client" in names and "ctxfleet" not in names and "asyncpg" not in names
    found = await asyncio.to_thread(
        _run,
        python,
        "-c",
        "import importlib.util as u; print([m for m in ('services', 'workers', 'infra') if u.find_spec(m)])",
        cwd=tmp_path,
    )
    assert found.strip() == "[]"

    runtime = shutil.copy(ROOT / "tests" / "e2e" / "client_runtime.py", tmp_path / "runtime.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CTX_", "PYTHON"))}
    env |= {"CTX_NATS_URL": streams, "CTX_TENANT": "default"}
    out = await asyncio.to_thread(_run, python, runtime, SAMPLE, "reservation", cwd=tmp_path, env=env)
    seen = json.loads(out.splitlines()[-1])

    assert seen["errors"] == []
    assert seen["prepares"] == SAMPLE_PREPARES
    # Every prepare answered with a provider body, in each of the three formats in turn.
    assert set(seen["formats"]) == {"openai.chat", "openai.responses", "anthropic.messages"}
    assert sum(seen["formats"].values()) == SAMPLE_PREPARES
    for shape, first_line in seen["answers"].items():
        assert first_line.endswith("hit(s), best first; each names its ref]"), (shape, first_line)

    # The README's Python quick start runs as written, on the wheel alone.
    readme = (ROOT / "README.md").read_text().split("## Quick start in Python", 1)[1]
    quick = tmp_path / "quick.py"
    quick.write_text(readme.split("```python\n", 1)[1].split("```", 1)[0])
    printed = await asyncio.to_thread(_run, python, quick, cwd=tmp_path, env=env)
    assert printed.startswith("system You fix bugs."), printed
