"""``ctx.gateway.check``: prepare, edit the request as a runtime would, check it — real NATS and Postgres."""

from __future__ import annotations

import copy
import uuid
from functools import partial
from typing import Any

import asyncpg
import pytest

import workers.compose

from contracts import GatewayAddition, PreparedContext, PrepareRequest, Purpose
from contracts.hooks import AdditionCategory, HookBinding, HookPoint, HookSet
from services.app.final_checks import GatewayService
from ctxfleet_client.client import FleetClient
from contracts.exceptions import AdditionRefused, PreparedContextNotFound, ProtectedBlockAltered
from tests.fixtures.builders import Thread

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

TASK = "Fix the failing import in app.py"
SOURCE = "policy-engine@2"


async def _prepared(client: FleetClient, t: Thread, **request: Any) -> PreparedContext:
    return await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            after_event_key="task",
            **request,
        )
    )


async def _thread(client: FleetClient, release: str | None = None) -> Thread:
    t = Thread()
    system = t.system("You fix bugs in a Python repository.")
    await client.append(system.model_copy(update={"agent_release": release}) if release else system)
    await client.append(t.user(TASK, key="task"))
    return t


def _chat(prepared: PreparedContext) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": prepared.openai_messages()}


def _with_user_text(body: dict[str, Any], text: str) -> dict[str, Any]:
    body = copy.deepcopy(body)
    body["messages"].append({"role": "user", "content": text})
    return body


async def test_check_final_answers_ok_records_what_was_sent_and_refuses_an_edited_task(
    fleet: Any, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = await _thread(client)
    prepared = await _prepared(client, t, model_profile="gpt-4o")
    assert [m.authority.value for m in prepared.protected_block_manifest] == ["release_instruction", "user"]

    check = await client.check_final(prepared, _chat(prepared))
    assert (check.outcome, check.final_tokens) == ("ok", check.input_budget - check.remaining)
    again = await client.check_final(prepared, _chat(prepared))
    assert again == check  # the same attempt answers the verdict recorded first
    rows = await db.fetch(
        "SELECT outcome, final_tokens, request_sha256 FROM ctx.gateway_checks WHERE prepared_id = $1",
        prepared.prepared_id,
    )
    assert [tuple(r) for r in rows] == [("ok", check.final_tokens, check.request_sha256)]

    edited = copy.deepcopy(_chat(prepared))
    edited["messages"][1]["content"] = TASK + " and push to main"
    with pytest.raises(ProtectedBlockAltered) as caught:
        await client.check_final(prepared, edited, attempt=2)
    assert caught.value.details["how"] == "changed"

    with pytest.raises(AdditionRefused):
        await client.check_final(prepared, _with_user_text(_chat(prepared), "unlabelled"), attempt=3)

    other = prepared.model_copy(update={"prepared_id": "no-such-context"})
    with pytest.raises(PreparedContextNotFound):
        await client.check_final(other, _chat(prepared))


async def test_additions_crossing_the_soft_limit_reprepare_once_and_are_carried(
    fleet: Any, client: FleetClient
) -> None:
    binding = HookBinding(
        name="policy-engine",
        version="2",
        point=HookPoint.PREPARE_BEFORE,
        subject="hooks.default.policy",
        # The check reads this grant; the hook itself never runs here (it is granted, not called:
        # its purposes exclude the prepares below).
        purposes=(Purpose.COMPLETION,),
        grants=(AdditionCategory.MATERIAL,),
    )
    release = f"gw-{uuid.uuid4().hex[:8]}"
    await client.register_hooks(HookSet(release=release, hooks=(binding,)))
    t = await _thread(client, release=release)
    # A budget the prepared context fills to well under the default policy's 0.8 trigger, and the
    # addition takes over it (but not over the budget).
    prepared = await _prepared(client, t, budget_tokens=400)
    text = "Policy excerpt: imports are sorted by isort. " * 32
    addition = GatewayAddition(source=SOURCE, category=AdditionCategory.MATERIAL, text=text)
    body = _with_user_text(_chat(prepared), text)

    first = await client.check_final(prepared, body, (addition,))
    assert first.outcome == "context_reprepare_required"
    assert first.soft_limit is not None and first.final_tokens >= first.soft_limit
    second = await client.check_final(prepared, body, (addition,), attempt=2)
    assert second.outcome == "ok"  # at most once per prepared context

    again = await _prepared(client, t, budget_tokens=400, carry_additions_from=first.check_id)
    assert any(m.content == text for m in again.messages)
    carried = await client.check_final(again, _chat(again))
    assert carried.outcome == "ok"
    more = "Another excerpt."
    extra = GatewayAddition(source=SOURCE, category=AdditionCategory.MATERIAL, text=more)
    crossed_again = await client.check_final(again, _with_user_text(_chat(again), more), (extra,), attempt=2)
    assert crossed_again.outcome == "ok"  # a re-prepared context is never asked to re-prepare


@pytest.mark.parametrize("format", ["openai.responses", "anthropic.messages"])
async def test_check_final_reads_the_record_written_behind_the_prepare_when_nothing_is_cached(
    start_fleet: Any, client: FleetClient, format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No context kept in memory: every check reads ctx.prepared_contexts, as another replica would.
    monkeypatch.setattr(workers.compose, "GatewayService", partial(GatewayService, cache_contexts=0))
    await start_fleet()
    t = await _thread(client)
    prepared = await _prepared(client, t, model_profile="gpt-4o", format=format)
    assert prepared.request is not None
    check = await client.check_final(prepared, prepared.request)
    assert check.outcome == "ok"
    edited = copy.deepcopy(prepared.request)
    edited.pop("instructions" if format == "openai.responses" else "system")
    with pytest.raises(ProtectedBlockAltered) as caught:
        await client.check_final(prepared, edited, attempt=2)
    assert caught.value.details["how"] == "missing"
