"""The assembler over real servers: read-your-writes, typed errors, tool groups, determinism."""

from __future__ import annotations

import time

import nats
import pytest

from contracts import ToolSchema
from contracts.subjects import prepare_subject
from ctxfleet_client.client import FleetClient
from contracts.exceptions import (
    ContextBudgetExceeded,
    InvalidRequest,
    NotYetRecorded,
    ThreadNotFound,
    UnknownModelProfile,
)
from tests.fixtures.builders import Thread, prepare_request as _request

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def _coding_turn(client: FleetClient, t: Thread) -> str:
    await client.append(t.system("You fix bugs."))
    await client.append(t.user("Fix the failing parser test."))
    await client.append(
        t.assistant(
            "Looking.", calls=(("c1", "bash", {"cmd": "pytest -x"}), ("c2", "read", {"path": "parser.py"}))
        )
    )
    # Outcomes arrive in the opposite order of the calls.
    await client.append(t.outcome("c2", "def parse(): ..."))
    await client.append(t.outcome("c1", "E AssertionError", status="error", key="last"))
    return "last"


async def test_prepare_reflects_every_event_published_before_it(fleet, client: FleetClient) -> None:
    t = Thread()
    for i in range(50):
        await client.append(t.user(f"question {i}", key=f"q{i}"))
        prepared = await client.prepare(_request(t, after_event_key=f"q{i}"))
        assert prepared.messages[-1].content == f"question {i}"
        assert prepared.source_watermark.last_event_key == f"q{i}"


async def test_prepare_waits_then_fails_with_not_yet_recorded_never_a_stale_context(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.user("recorded", key="k1"))
    await client.prepare(_request(t, after_event_key="k1"))
    started = time.monotonic()
    with pytest.raises(NotYetRecorded) as err:
        await client.prepare(_request(t, after_event_key="never-published", wait_ms=300))
    assert time.monotonic() - started >= 0.3
    assert err.value.retryable and err.value.details["event_key"] == "never-published"


async def test_prepare_keeps_tool_group_whole_with_results_in_call_order(fleet, client: FleetClient) -> None:
    t = Thread()
    last = await _coding_turn(client, t)
    prepared = await client.prepare(_request(t, after_event_key=last))
    roles = [(m.role, m.tool_call_id) for m in prepared.messages]
    assert roles == [("system", None), ("user", None), ("assistant", None), ("tool", "c1"), ("tool", "c2")]
    assert prepared.messages[3].content == "[tool status: error]\nE AssertionError"
    group = next(b for b in prepared.blocks if b.block_id.startswith("group:"))
    assert group.message_count == 3 and [s.seq for s in group.sources] == [3, 4, 5]


async def test_prepare_holds_back_an_open_group_whole_and_reports_pending_calls(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.user("Check both files."))
    await client.append(t.assistant(calls=(("c1", "read", {"path": "a"}), ("c2", "read", {"path": "b"}))))
    await client.append(t.outcome("c1", "contents of a", key="o1"))
    prepared = await client.prepare(_request(t, after_event_key="o1"))
    assert [m.role for m in prepared.messages] == ["user"]
    assert [p.call_id for p in prepared.pending_calls] == ["c2"]
    assert prepared.omitted[0].block_id == "group:2" and "open tool group" in prepared.omitted[0].reason


async def test_prepare_is_byte_identical_for_the_same_records_and_request(fleet, client: FleetClient) -> None:
    t = Thread()
    last = await _coding_turn(client, t)
    request = _request(
        t, after_event_key=last, tools=(ToolSchema(name="bash", parameters={"type": "object"}),)
    )
    first = await client.prepare(request)
    second = await client.prepare(request)
    assert first.model_dump_json() == second.model_dump_json()


async def test_prepare_answers_typed_errors_for_bad_requests(
    fleet, client: FleetClient, nats_url: str
) -> None:
    t = Thread()
    await client.append(t.user("hi", key="k1"))
    await client.prepare(_request(t, after_event_key="k1"))
    with pytest.raises(UnknownModelProfile):
        await client.prepare(_request(t, model_profile="gpt-99"))
    with pytest.raises(ThreadNotFound):
        await client.prepare(_request(Thread()))
    with pytest.raises(ThreadNotFound):  # another session's thread looks exactly like a missing one
        await client.prepare(_request(t, session_id="s-someone-else"))
    nc = await nats.connect(nats_url)
    try:
        reply = await nc.request(prepare_subject("default", t.thread_id), b'{"session_id": 3}', timeout=5)
        assert b'"code":"invalid_request"' in reply.data
        other = _request(Thread()).model_dump_json().encode()
        reply = await nc.request(prepare_subject("default", t.thread_id), other, timeout=5)
        assert b'"code":"invalid_request"' in reply.data
    finally:
        await nc.close()
    assert InvalidRequest.code.value == "invalid_request"


async def test_prepare_refuses_when_required_content_exceeds_the_budget_with_itemized_sizes(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.system("instructions " * 300))
    await client.append(t.user("the request", key="k2"))
    with pytest.raises(ContextBudgetExceeded) as err:
        await client.prepare(_request(t, model_profile=None, budget_tokens=200, after_event_key="k2"))
    items = err.value.details["items"]
    assert isinstance(items, list) and {i["block_id"] for i in items} >= {"instruction:1", "task:2"}  # type: ignore[index]
    assert err.value.details["required"] > 200  # type: ignore[operator]


async def test_prepare_over_budget_waits_for_compaction_and_answers_within_budget(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await client.append(t.system("Be brief."))
    for i in range(6):
        await client.append(t.user(f"question {i}: " + "why does the parser drop spaces " * 10))
        await client.append(
            t.assistant(f"answer {i}: " + "the tokenizer joins adjacent tokens without separators " * 40)
        )
    await client.append(t.user("final question", key="final"))
    full = await client.prepare(_request(t, after_event_key="final"))
    budget = full.budget_report.used.total // 2  # half of what the whole history needs
    prepared = await client.prepare(
        _request(t, model_profile=None, budget_tokens=budget, after_event_key="final")
    )
    assert prepared.budget_report.used.total <= budget
    # seq 2 (the run's task, "question 0") is never covered: it is shown verbatim before the summary.
    assert prepared.summary is not None and prepared.summary.covered_from == 3
    assert prepared.messages[0].role == "system" and prepared.messages[-1].content == "final question"
    assert str(prepared.messages[1].content).startswith("question 0: ")
    assert prepared.messages[2].content.startswith("[context summary")  # type: ignore[union-attr]
    assert prepared.omitted == ()  # history was summarized, not dropped
    # The urgent job this prepare asked for is counted like the budgeter's, so dashboards see its cause.
    registry = fleet.metrics.registry
    assert (
        registry.get_sample_value(
            "ctx_compaction_trigger_hits_total", {"condition": "hard_budget", "policy": "default"}
        )
        or 0
    ) >= 1
    assert (
        registry.get_sample_value(
            "ctx_compaction_jobs_total", {"outcome": "enqueued", "reason": "hard_budget"}
        )
        or 0
    ) >= 1
