"""`ctxfleet eval` as a user runs it: bundled samples, a 4.7k-token system prompt, an 8k budget.

The assertions are the context manager's goals, used as the specification: no failed prepare while the
required content fits; the task, every written file and the head of the last tool outcome in
every context whose full history no longer fits. And a fleet serving beside it keeps its sessions
to itself: eval runs on servers of its own unless told to use the running fleet, and then as a
tenant of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from infra import SAMPLES_DIR
from tests.fixtures.fleet import reset_streams
from tests.fixtures.servers import with_database

pytestmark = [pytest.mark.pg, pytest.mark.nats]

ROOT = Path(__file__).resolve().parents[2]
TRACES = [
    SAMPLES_DIR / "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl",
    SAMPLES_DIR / "mini-swe-agent-deepseek__deepseek_chat_dev__sqlfluff__sqlfluff-2419.jsonl",
]
PROMPT = SAMPLES_DIR / "system-prompt-large.txt"
BUDGET = 8000


@pytest.fixture(scope="module")
def evaluation(
    tmp_path_factory: pytest.TempPathFactory, nats_url: str, pg_server_url: str, pg_template: str
) -> Iterator[dict[str, Any]]:
    """One `ctxfleet eval` run (workers in its own process, on the test servers), shared by the tests."""
    name = f"ctx_eval_{uuid.uuid4().hex[:12]}"
    asyncio.run(_sql(pg_server_url, f"CREATE DATABASE {name} TEMPLATE {pg_template}"))
    asyncio.run(reset_streams(nats_url))
    tmp = tmp_path_factory.mktemp("eval")
    env = {
        **os.environ,
        "CTX_NATS_URL": nats_url,
        "CTX_DATABASE_URL": with_database(pg_server_url, name),
        "CTX_DATA_DIR": str(tmp / "data"),
        "CTX_PARTITIONS": "4",
    }
    out = tmp / "eval.json"
    args = [
        *map(str, TRACES),
        "--budget",
        str(BUDGET),
        "--system-prompt",
        str(PROMPT),
        "--fleet",
        "in-process",
        "--json",
        str(out),
    ]
    try:
        result = subprocess.run(
            [sys.executable, "-m", "infra.cli", "eval", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=110,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        report: dict[str, Any] = json.loads(out.read_text())
        report["stdout"] = result.stdout
        yield report
    finally:
        asyncio.run(_sql(pg_server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


async def _sql(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def _fleet(report: dict[str, Any]) -> dict[str, Any]:
    fleet: dict[str, Any] = report["aggregate"][str(BUDGET)]["ctxfleet"]
    return fleet


def test_eval_scores_every_trace_beside_the_three_baselines_and_prints_the_tables(
    evaluation: dict[str, Any],
) -> None:
    assert [t["trace"] for t in evaluation["traces"]] == [p.name for p in TRACES]
    assert 4_500 <= evaluation["system_prompt_tokens"] <= 5_000
    for trace in evaluation["traces"]:
        systems = trace["systems"]
        assert list(systems) == ["ctxfleet", "full", "window", "masking"]
        scored = systems["full"]["scored_contexts"]
        assert scored > 0 and all(s["scored_contexts"] == scored for s in systems.values())
        assert systems["full"]["failed"] == scored  # the whole history no longer fits: that is what is scored
        for point in trace["points"]:
            for name in ("window", "masking"):
                assert point["systems"][name]["failed"] or point["systems"][name]["tokens"] <= BUDGET
    assert "all traces, per budget" in evaluation["stdout"] and "masking" in evaluation["stdout"]


def test_eval_prices_every_system_per_task_with_each_default_profile(evaluation: dict[str, Any]) -> None:
    assert list(evaluation["prices"]) == ["gpt-4.1", "claude-sonnet-4"]
    for name, system in evaluation["aggregate"][str(BUDGET)].items():
        for profile in evaluation["prices"]:
            bill = system["cost"][profile]
            assert bill["usd_per_task"] > 0 and 0 < bill["cache_hit_share"] < 1, (name, profile, bill)
    assert f"cost per task at {BUDGET} as claude-sonnet-4" in evaluation["stdout"]


def test_eval_adds_the_summarizers_calls_to_ctxfleets_cost_and_prints_the_floor(
    evaluation: dict[str, Any],
) -> None:
    fleet = _fleet(evaluation)
    for profile in evaluation["prices"]:
        summarizer = fleet["cost"][profile]["summarizer"]
        assert 0 < summarizer["calls"] <= fleet["compactions"]
        assert 0 < summarizer["usd"] < fleet["cost"][profile]["usd"]
        assert 0 < evaluation["floor"][str(BUDGET)][profile] < 1
    assert "floor " in evaluation["stdout"] and "summarizer $" in evaluation["stdout"]


def test_no_prepare_fails_while_the_required_content_fits(evaluation: dict[str, Any]) -> None:
    assert _fleet(evaluation)["failed_while_required_fits"] == 0


def test_no_prepared_context_exceeds_the_budget_by_an_independent_count(evaluation: dict[str, Any]) -> None:
    assert _fleet(evaluation)["over_budget"] == 0


@pytest.mark.parametrize("probe", ["task", "files_written", "last_outcome"])
def test_every_probed_context_shows_the_task_the_files_written_and_the_last_outcome(
    evaluation: dict[str, Any], probe: str
) -> None:
    tally = _fleet(evaluation)["probes"][probe]
    assert tally["total"] > 0
    assert tally["passed"] == tally["total"], [m for m in _fleet(evaluation)["misses"] if m["probe"] == probe]


# The shortest bundled trace at one budget: the smallest evaluation that writes sessions.
SMALL = SAMPLES_DIR / "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl"


def test_eval_leaves_a_running_fleet_alone_unless_asked_and_then_writes_only_under_its_own_tenant(
    serving_fleet: dict[str, str], database_url: str
) -> None:
    replayed = _cli("replay", str(SMALL), "-q", env=serving_fleet)
    assert replayed.returncode == 0, replayed.stderr
    before = asyncio.run(_sessions(database_url))
    assert [tenant for tenant, _ in before] == ["default"]

    alone = _cli("eval", str(SMALL), "--budget", "4000", env=serving_fleet)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert asyncio.run(_sessions(database_url)) == before

    asked = _cli("eval", str(SMALL), "--budget", "4000", "--fleet", "running", env=serving_fleet)
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert "as tenant 'eval'" in asked.stderr
    after = asyncio.run(_sessions(database_url))
    added = sorted(set(after) - set(before))
    assert set(before) <= set(after) and added and {tenant for tenant, _ in added} == {"eval"}


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )


async def _sessions(url: str) -> list[tuple[str, str]]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT tenant, session_id FROM ctx.sessions ORDER BY tenant, session_id")
    finally:
        await conn.close()
    return [(r["tenant"], r["session_id"]) for r in rows]
