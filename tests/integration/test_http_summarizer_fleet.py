"""The fleet compacting through an OpenAI-compatible endpoint (a local scripted server)."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from contracts import CompactionPolicy, ContextPolicy, PrepareRequest
from ctxfleet_client.client import FleetClient
from contracts.exceptions import ThreadNotFound
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually
from tests.fixtures.scripted_openai import ScriptedOpenAI, scripted_openai  # noqa: F401

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


def _answer() -> dict[str, Any]:
    return {
        "goal": {"text": "Find why file imports fail", "sources": [3]},
        "current_request": None,
        "constraints": [],
        "decisions": [{"text": "read the files one by one", "sources": [3]}],
        "progress": [{"text": "read file0.py and the next files; all imports resolve", "sources": [3, 4]}],
        "files_read": [{"path": "file0.py", "sources": [3]}],
        "files_modified": [],
        "failures": [],
        "unresolved": [],
        "next_steps": [{"text": "check the remaining files", "sources": [4]}],
        "references": [],
    }


def _chat(content: str) -> tuple[int, dict[str, Any]]:
    return 200, {
        "choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 900, "completion_tokens": 80},
    }


async def _run(start_fleet, client: FleetClient, scripted: ScriptedOpenAI, name: str) -> Thread:  # type: ignore[no-untyped-def]
    await start_fleet(
        summarizer="openai", summarizer_base_url=scripted.base_url, summarizer_model="summary-model"
    )
    policy = ContextPolicy(
        name=name,
        model_profile=None,
        budget_tokens=2_500,
        compaction=CompactionPolicy(keep_recent_groups=1, max_compaction_calls=8),
    )
    await client.register_policy(policy)
    t = Thread()
    await client.append(t.system("You investigate import errors.").model_copy(update={"policy": name}))
    await client.append(t.user("Why do the imports fail?", key="task"))
    for i in range(10):
        await client.append(
            t.assistant(f"reading file{i}.py", calls=((f"c{i}", "bash", {"cmd": f"cat file{i}.py"}),))
        )
        await client.append(t.outcome(f"c{i}", f"import os  # file{i}.py\n" * 25, key=f"o{i}"))
    return t


async def _inspect(client: FleetClient, t: Thread):  # type: ignore[no-untyped-def]
    try:
        return await client.inspect(t.thread_id, limit=1)
    except ThreadNotFound:
        return None


async def test_compaction_through_an_openai_compatible_summarizer_commits_its_structured_answer(
    start_fleet,
    client: FleetClient,
    scripted_openai: ScriptedOpenAI,
    db: asyncpg.Connection,  # noqa: F811
) -> None:
    too_long = (
        400,
        {"error": {"code": "context_length_exceeded", "message": "maximum context length is 8192 tokens"}},
    )
    scripted_openai.script([too_long] + [_chat(json.dumps(_answer()))] * 20)
    t = await _run(start_fleet, client, scripted_openai, "http-ok")

    async def committed() -> bool:
        i = await _inspect(client, t)
        return i is not None and i.summaries >= 1

    await eventually(committed, timeout=20, what="a summary from the HTTP summarizer")
    row = await db.fetchrow(
        "SELECT summarizer, calls, text FROM ctx.summaries WHERE thread_id=$1 ORDER BY view_revision LIMIT 1",
        t.thread_id,
    )
    assert (
        row["summarizer"] == "openai-compatible" and row["calls"] >= 3
    )  # one rejected segment, then its halves
    assert "read the files one by one (seq 3)" in row["text"]
    first = scripted_openai.requests[0].body
    assert "tools" not in first and first["model"] == "summary-model"
    prepared = await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            budget_tokens=2_500,
            after_event_key="o9",
        )
    )
    assert prepared.summary is not None


async def test_malformed_model_answers_fail_the_compaction_and_never_move_the_baseline(
    start_fleet,
    client: FleetClient,
    scripted_openai: ScriptedOpenAI,
    db: asyncpg.Connection,  # noqa: F811
) -> None:
    scripted_openai.script([_chat("this is not json")] * 20)
    t = await _run(start_fleet, client, scripted_openai, "http-bad")

    async def failed() -> bool:
        i = await _inspect(client, t)
        return i is not None and i.compaction_failures >= 1

    await eventually(failed, timeout=20, what="a recorded compaction failure")
    inspection = await client.inspect(t.thread_id, limit=1)
    assert inspection.summaries == 0 and "malformed" in (inspection.last_compaction_failure or "")
    row = await db.fetchrow(
        "SELECT baseline_model_steps, view_revision FROM ctx.thread_views WHERE thread_id=$1", t.thread_id
    )
    assert (row["baseline_model_steps"], row["view_revision"]) == (0, 0)
