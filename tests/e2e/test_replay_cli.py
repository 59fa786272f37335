"""End to end, as a user runs it: `ctxfleet up` serving, `ctxfleet replay` from another process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from contracts import PreparedContext
from infra import SAMPLES_DIR
from infra.credentials import load_credentials
from infra.embedded import EmbeddedPostgres
from infra.startup_replay import SAMPLE as STARTUP_SAMPLE
from infra.startup_replay import SAMPLE_BUDGET
from services.core.trace import read_trace

pytestmark = [pytest.mark.pg, pytest.mark.nats]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = SAMPLES_DIR / "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl"


def _ctxfleet(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_replay_against_running_fleet_writes_report_and_ordered_context_dumps(
    serving_fleet: dict[str, str], tmp_path: Path
) -> None:
    report_path, dumps = tmp_path / "report.json", tmp_path / "contexts"
    result = _ctxfleet(
        "replay", str(SAMPLE), "--report", str(report_path), "--dump-contexts", str(dumps), env=serving_fleet
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(report_path.read_text())
    lines = read_trace(SAMPLE)
    expected_prepares = sum(1 for line in lines[1:] if line.kind == "assistant_message")
    totals = report["totals"]
    assert totals["events"] == len(lines) and totals["prepares"] == expected_prepares == len(
        report["prepares"]
    )
    assert totals["errors"] == 0
    assert totals["latency_ms_p50"] <= totals["latency_ms_p99"]
    assert totals["prepared_tokens_sum"] <= totals["full_history_tokens_sum"]
    for entry in report["prepares"]:
        assert {"seq", "prepared_tokens", "input_budget", "messages", "latency_ms"} <= set(entry)
    files = sorted(p.name for p in dumps.iterdir())
    assert files == [f"{i:04d}.json" for i in range(1, expected_prepares + 1)]
    for name in files:
        _assert_protocol_valid(PreparedContext.model_validate_json((dumps / name).read_text()))


def test_replay_twice_gives_the_same_messages_and_inspect_verifies_the_chain(
    serving_fleet: dict[str, str], tmp_path: Path
) -> None:
    runs = []
    for n in (1, 2):
        dumps = tmp_path / f"run{n}"
        report = tmp_path / f"r{n}.json"
        # Under the default budget nothing compacts, so the views are the same whatever the timing.
        result = _ctxfleet(
            "replay", str(SAMPLE), "--dump-contexts", str(dumps), "--report", str(report), env=serving_fleet
        )
        assert result.returncode == 0, result.stderr
        runs.append([json.loads(p.read_text())["messages"] for p in sorted(dumps.iterdir())])
        session = json.loads(report.read_text())["totals"]["session_id"]
    assert runs[0] == runs[1]
    inspect = _ctxfleet("inspect", f"{session}-r1.main", "--json", env=serving_fleet)
    assert inspect.returncode == 0, inspect.stderr
    assert json.loads(inspect.stdout)["chain_verified"] is True
    human = _ctxfleet("inspect", f"{session}-r1.main", env=serving_fleet)
    assert "hash chain verified" in human.stdout


def test_replay_with_a_small_budget_compacts_and_never_exceeds_it(
    serving_fleet: dict[str, str], tmp_path: Path
) -> None:
    report = tmp_path / "small.json"
    result = _ctxfleet("replay", str(SAMPLE), "--report", str(report), "--budget", "3000", env=serving_fleet)
    assert result.returncode == 0, result.stderr
    data = json.loads(report.read_text())
    assert (
        data["totals"]["compactions"] >= 1
        and data["totals"]["over_budget"] == 0
        and data["totals"]["errors"] == 0
    )
    assert all(p["over_budget"] is False and p["input_budget"] == 3000 for p in data["prepares"])
    assert data["prepares"][-1]["summary_revision"] >= 1
    assert data["totals"]["prepared_tokens_sum"] < data["totals"]["full_history_tokens_sum"] / 2


def test_up_replays_the_sample_until_it_compacts_and_ends_with_a_context_line_that_works(
    streams: str, database_url: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "CTX_NATS_URL": streams,
        "CTX_DATABASE_URL": database_url,
        "CTX_DATA_DIR": str(tmp_path / "data"),
        "CTX_PARTITIONS": "4",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "up"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        printed = []
        for line in proc.stdout:
            printed.append(line)
            if "serving" in line:
                break
        else:
            pytest.fail(f"fleet exited {proc.wait()}:\n{''.join(printed)}")
        closing = _closing_block("".join(printed))
        assert closing["compactions"] >= 1, printed
        # The thread as the replay left it: a compaction committed, its summary in the view.
        assert _summaries(database_url, closing["thread"]) >= 1
        # Pasted into a second terminal, which knows nothing but the checkout.
        words = shlex.split(closing["context"])
        second = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
        while "=" in words[0]:
            name, _, value = words.pop(0).partition("=")
            second[name] = value
        assert words[0] == ".venv/bin/ctxfleet"
        shown = subprocess.run(
            [sys.executable, "-m", "infra.cli", *words[1:]],
            cwd=ROOT,
            env=second,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        assert f"Context {closing['thread']}" in shown.stdout and "summary" in shown.stdout
        # The startup's whole history is the one the context command states.
        history = re.search(r": context ([\d,]+) → [\d,]+ tokens \(whole history", "".join(printed))
        assert history is not None and f"whole history {history[1]} tokens" in shown.stdout, shown.stdout
        with urllib.request.urlopen(closing["console"], timeout=10) as page:
            assert closing["thread"] in page.read().decode()
        with urllib.request.urlopen(closing["metrics"], timeout=10) as metrics:
            assert "ctx_" in metrics.read().decode()
    finally:
        proc.send_signal(2)  # Ctrl-C
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0 and "stopped cleanly" in out, out


def _closing_block(stdout: str) -> dict[str, Any]:
    """The figures and lines that close the startup replay (infra.startup_replay.closing_lines)."""
    figures = re.search(r"^  (\d+) events, \d+ prepares .*?, (\d+) compactions?", stdout, re.M)
    assert figures is not None, stdout
    block: dict[str, Any] = {"events": int(figures[1]), "compactions": int(figures[2])}
    for name in ("thread", "context", "console", "metrics"):
        found = re.search(rf"^  {name} +(\S.*)$", stdout, re.M)
        assert found is not None, f"no {name} line in:\n{stdout}"
        block[name] = found[1]
    return block


def _summaries(database_url: str, thread_id: str) -> int:
    async def count() -> int:
        import asyncpg

        conn = await asyncpg.connect(database_url)
        try:
            return int(
                await conn.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id = $1", thread_id)
            )
        finally:
            await conn.close()

    return asyncio.run(count())


def test_replay_without_a_running_fleet_says_how_to_start_one(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env["CTX_DATA_DIR"] = str(tmp_path / "nothing-here")
    result = _ctxfleet("replay", str(SAMPLE), env=env)
    assert result.returncode == 2 and "make run" in result.stderr


def test_up_on_embedded_servers_replays_the_sample_and_a_second_run_reuses_the_data(
    server_folder: Path,
) -> None:
    tmp_path = server_folder
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env["CTX_DATA_DIR"] = str(tmp_path / "data")
    for _ in range(2):
        result = _ctxfleet("up", "--exit-after-replay", env=env, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        closing = _closing_block(result.stdout)
        assert closing["events"] == len(read_trace(STARTUP_SAMPLE)) and closing["compactions"] >= 1
        assert closing["context"].endswith(f"context {closing['thread']} --budget {SAMPLE_BUDGET}")
        assert closing["console"].endswith(f"/console/threads/{closing['thread']}")
        assert closing["metrics"].endswith("/metrics")
    # The cluster now requires the superuser's generated password (infra.credentials).
    creds = load_credentials(tmp_path / "data")
    assert creds is not None
    pg = EmbeddedPostgres(tmp_path / "data" / "postgres", password=creds.postgres)
    url = pg.start()
    try:
        import asyncpg

        async def sessions() -> int:
            conn = await asyncpg.connect(url)
            try:
                return int(await conn.fetchval("SELECT count(*) FROM ctx.sessions"))
            finally:
                await conn.close()

        assert asyncio.run(sessions()) == 2
    finally:
        pg.stop()


def _assert_protocol_valid(prepared: PreparedContext) -> None:
    """Every tool call is answered right after its message; no result without its call."""
    messages = prepared.messages
    i = 0
    while i < len(messages):
        m = messages[i]
        assert m.role != "tool", f"tool result without its call at message {i}"
        if m.tool_calls:
            ids = [c.id for c in m.tool_calls]
            answers = [x.tool_call_id for x in messages[i + 1 : i + 1 + len(ids)]]
            assert answers == ids, f"group at {i} is not whole: {ids} vs {answers}"
            i += len(ids)
        i += 1


def test_a_trace_that_does_not_exist_is_one_line_naming_it_not_a_traceback(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    env = {**os.environ, "CTX_NATS_URL": "nats://127.0.0.1:1", "CTX_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run(
        [sys.executable, "-m", "infra.cli", "replay", str(missing)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"ctxfleet: No such file or directory: {missing}"
    assert "Traceback" not in done.stderr
