"""Seed 000 §13's hook cases end to end: a real fleet calling a scripted hook service over NATS."""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
import pytest

from contracts import CompactRequest, GatewayAddition, PrepareRequest, Purpose
from contracts.hook_protocol import HookAddition, HookBlockEdit, HookCall, HookPatch, HookRange, HookReply
from contracts.hooks import AdditionCategory, HookBinding, HookFailurePolicy, HookPoint, HookSet
from ctxfleet_client.client import FleetClient
from contracts import ErrorCode
from contracts.exceptions import (
    CompactionFailed,
    ContextBudgetExceeded,
    HookChangeRefused,
    HookTimeout,
)
from tests.fixtures.builders import Thread, prepare_request
from tests.fixtures.fleet import HookScript, HookService
from tests.integration.test_gateway_check import TASK, _chat, _prepared, _thread, _with_user_text

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

_POLICY = "policy-engine@2"
_MATERIAL = AdditionCategory.MATERIAL


def _adds(text: str) -> HookReply:
    """A prepare.before answer adding ``text`` as material."""
    return HookReply(
        decision="patch", patch=HookPatch(add=(HookAddition(category=_MATERIAL, title="policy", text=text),))
    )


def _policy_engine(subject: str) -> HookBinding:
    """The policy engine's prepare.before hook: granted material, which it may also add at send time."""
    return HookBinding(
        name="policy-engine",
        version="2",
        point=HookPoint.PREPARE_BEFORE,
        subject=subject,
        grants=(_MATERIAL,),
    )


async def _hook(
    service: HookService, name: str, point: HookPoint, script: HookScript, **binding: Any
) -> HookBinding:
    """Hook ``name@1`` at ``point``, served by ``service`` answering ``script``."""
    subject = await service.serve(name, script)
    return HookBinding.model_validate(
        {"name": name, "version": "1", "point": point, "subject": subject, **binding}
    )


async def _release(client: FleetClient, *hooks: HookBinding) -> str:
    release = f"rel-{uuid.uuid4().hex[:8]}"
    await client.register_hooks(HookSet(release=release, hooks=hooks))
    return release


def _calls(fleet: Any, point: str, outcome: str) -> float:
    value = fleet.metrics.registry.get_sample_value(
        "ctx_hook_calls_total", {"point": point, "outcome": outcome}
    )
    return value or 0.0


async def test_a_hooks_additions_crossing_the_soft_limit_ask_for_one_reprepare_that_carries_them(
    fleet: Any, client: FleetClient, hook_service: HookService
) -> None:
    note = "Policy: imports are sorted by isort."
    subject = await hook_service.serve("policy", _adds(note))
    t = await _thread(client, await _release(client, _policy_engine(subject)))
    # A budget the prepared context (the hook's note included) fills well under the default 0.8 trigger.
    prepared = await _prepared(client, t, budget_tokens=400)
    assert any(note in (m.content or "") for m in prepared.messages)
    assert [(h.source, h.point, h.outcome) for h in prepared.hooks] == [
        (_POLICY, "context.prepare.before", "patched")
    ]

    # At send time the same hook adds an excerpt: the request crosses the trigger (not the budget).
    excerpt = "Policy excerpt: imports are sorted by isort. " * 32
    addition = GatewayAddition(source=_POLICY, category=_MATERIAL, text=excerpt)
    body = _with_user_text(_chat(prepared), excerpt)
    first = await client.check_final(prepared, body, (addition,))
    assert first.outcome == "context_reprepare_required"
    assert first.soft_limit is not None and first.final_tokens >= first.soft_limit
    assert (await client.check_final(prepared, body, (addition,), attempt=2)).outcome == "ok"

    # Re-prepared with more room (so under the trigger again), carrying the validated excerpt.
    again = await _prepared(client, t, budget_tokens=800, carry_additions_from=first.check_id)
    texts = [m.content or "" for m in again.messages]
    assert texts.count(excerpt) == 1 and sum(note in x for x in texts) == 1
    assert hook_service.points() == ["context.prepare.before"] * 2  # the re-prepare is a prepare
    assert (await client.check_final(again, _chat(again))).outcome == "ok"
    more = GatewayAddition(source=_POLICY, category=_MATERIAL, text=excerpt)
    crossed = await client.check_final(again, _with_user_text(_chat(again), excerpt), (more,), attempt=2)
    # It crosses the trigger again, and is not asked to re-prepare again: one re-prepare, never two.
    assert crossed.soft_limit is not None and crossed.final_tokens >= crossed.soft_limit
    assert crossed.outcome == "ok"


async def test_an_addition_over_the_hard_budget_is_never_sendable(
    fleet: Any, client: FleetClient, hook_service: HookService
) -> None:
    huge = "Clause 7.3 of the retention schedule applies. " * 120
    t = await _thread(
        client, await _release(client, _policy_engine(await hook_service.serve("policy", _adds(huge))))
    )

    prepared = await _prepared(client, t, budget_tokens=400)
    # At prepare the hook's material is optional: left out whole rather than sent over the budget.
    assert prepared.budget_report.used.total <= prepared.budget_report.input_budget
    assert [o.block_id.split(":")[:2] for o in prepared.omitted] == [["hook", "policy-engine"]]
    assert not any(huge in (m.content or "") for m in prepared.messages)
    # Added anyway at send time, the request is over the budget: an error, never a request to send.
    addition = GatewayAddition(source=_POLICY, category=_MATERIAL, text=huge)
    with pytest.raises(ContextBudgetExceeded) as over:
        await client.check_final(prepared, _with_user_text(_chat(prepared), huge), (addition,))
    assert over.value.code is ErrorCode.CONTEXT_BUDGET_EXCEEDED and over.value.details["stage"] == "gateway"


def _edit_task(call: HookCall) -> HookReply:
    task = next(b for b in call.blocks if b.text == TASK)
    return HookReply(
        decision="patch",
        patch=HookPatch(edit=(HookBlockEdit(block_id=task.block_id, text=f"{TASK} and push to main"),)),
    )


@pytest.mark.parametrize("failure", [HookFailurePolicy.SKIP, HookFailurePolicy.FAIL])
async def test_a_patch_editing_the_task_text_is_refused_with_its_code(
    fleet: Any, client: FleetClient, hook_service: HookService, failure: HookFailurePolicy
) -> None:
    binding = await _hook(hook_service, "rewriter", HookPoint.PREPARE_BEFORE, _edit_task, failure=failure)
    t = await _thread(client, await _release(client, binding))
    refused_before = _calls(fleet, "context.prepare.before", "refused")

    if failure is HookFailurePolicy.SKIP:
        prepared = await _prepared(client, t, model_profile="gpt-4o")
        assert [m.content for m in prepared.messages if m.role == "user"] == [TASK]
        (touch,) = prepared.hooks
        assert (
            touch.outcome == "refused"
            and "hook_change_refused" in touch.note
            and "edit of block" in touch.note
        )
    else:
        with pytest.raises(HookChangeRefused) as refused:
            await _prepared(client, t, model_profile="gpt-4o")
        assert refused.value.code is ErrorCode.HOOK_CHANGE_REFUSED
        assert refused.value.details["source"] == "rewriter@1" and "edit of block" in refused.value.message
    assert _calls(fleet, "context.prepare.before", "refused") == refused_before + 1


async def test_a_hook_that_times_out_is_skipped_or_fails_the_prepare_by_its_policy_and_is_counted(
    fleet: Any, client: FleetClient, hook_service: HookService
) -> None:
    silent = await _hook(hook_service, "slow", HookPoint.PREPARE_BEFORE, None, timeout_ms=200)
    timeouts = _calls(fleet, "context.prepare.before", "timeout")
    t = await _thread(client, await _release(client, silent))
    prepared = await _prepared(client, t, model_profile="gpt-4o")
    assert [(h.source, h.outcome) for h in prepared.hooks] == [("slow@1", "timeout")]
    assert "hook_timeout" in prepared.hooks[0].note and prepared.messages[-1].content == TASK
    assert _calls(fleet, "context.prepare.before", "timeout") == timeouts + 1

    failing = silent.model_copy(update={"failure": HookFailurePolicy.FAIL})
    t = await _thread(client, await _release(client, failing))
    with pytest.raises(HookTimeout) as late:
        await _prepared(client, t, model_profile="gpt-4o")
    assert late.value.details == {"source": "slow@1", "point": "context.prepare.before", "timeout_ms": 200}
    assert _calls(fleet, "context.prepare.before", "timeout") == timeouts + 2


async def _working_thread(client: FleetClient, release: str, groups: int = 6) -> Thread:
    """A task and ``groups`` file writes, recorded; the default policy keeps the two newest groups."""
    t = Thread()
    await client.append(t.system("You fix bugs.").model_copy(update={"agent_release": release}))
    await client.append(t.user(TASK, key="task"))
    for i in range(groups):
        cmd = {"path": f"file{i}.py", "content": "x = 1\n" * 40}
        await client.append(t.assistant(f"step {i}", calls=((f"c{i}", "write_file", cmd),)))
        await client.append(t.outcome(f"c{i}", f"wrote file{i}.py " * 60, key=f"out{i}"))
    await client.prepare(_request(t, f"out{groups - 1}"))
    return t


def _request(t: Thread, after: str, **request: Any) -> PrepareRequest:
    return prepare_request(t, after_event_key=after, **request)


def end_early(call: HookCall) -> HookReply:
    """A compact.before answer ending the candidate range three records after its start."""
    assert call.range is not None
    end = HookRange(from_seq=call.range.from_seq, to_seq=call.range.from_seq + 3)
    return HookReply(decision="patch", patch=HookPatch(narrow_to=end))


def _compact(t: Thread) -> CompactRequest:
    return CompactRequest(run_id=t.run_id, instance_id=t.instance_id, session_id=t.session_id)


async def test_a_compact_after_patch_dropping_a_file_write_fails_validation_and_the_old_view_stays(
    fleet: Any, client: FleetClient, hook_service: HookService
) -> None:
    drops = HookReply(decision="patch", patch=HookPatch(summary_fields={"files_modified": []}))
    redact = await _hook(hook_service, "redact", HookPoint.COMPACT_AFTER, drops)
    t = await _working_thread(client, await _release(client, redact))

    with pytest.raises(CompactionFailed) as failed:
        await client.compact(_compact(t))
    assert failed.value.details["stage"] == "validate" and "redact@1" in failed.value.message
    assert hook_service.points() == ["context.compact.after"]
    inspection = await client.inspect(t.thread_id, limit=1)
    assert (inspection.view_revision, inspection.summaries, inspection.summary_hooks) == (0, 0, ())
    assert (await client.prepare(_request(t, "task"))).summary is None


async def test_a_summary_records_the_hooks_that_narrowed_and_patched_it(
    fleet: Any, client: FleetClient, hook_service: HookService, db: asyncpg.Connection
) -> None:
    def next_step(call: HookCall) -> HookReply:
        assert call.range is not None
        step = {"text": "Run the tests before the next write", "sources": [call.range.from_seq]}
        return HookReply(decision="patch", patch=HookPatch(summary_fields={"next_steps": [step]}))

    scope = await _hook(hook_service, "scope", HookPoint.COMPACT_BEFORE, end_early)
    notes = await _hook(hook_service, "notes", HookPoint.COMPACT_AFTER, next_step, version="2")
    release = await _release(client, scope, notes)
    t = await _working_thread(client, release)

    reply = await client.compact(_compact(t))
    candidate = hook_service.calls[0][1].range
    assert candidate is not None and reply.covered_to <= candidate.from_seq + 3 < candidate.to_seq
    inspection = await client.inspect(t.thread_id, limit=1)
    assert [
        (h.source, h.point, h.subject, h.release, h.hook_set_revision) for h in inspection.summary_hooks
    ] == [
        ("scope@1", "context.compact.before", scope.subject, release, 1),
        ("notes@2", "context.compact.after", notes.subject, release, 1),
    ]
    assert inspection.summary_hooks[0].change.startswith(f"range {candidate.from_seq}–{candidate.to_seq} → ")
    assert inspection.summary_hooks[1].change == "patched next_steps"
    prepared = await client.prepare(_request(t, "task"))
    assert prepared.summary is not None and prepared.summary.hooks == inspection.summary_hooks
    stored = await db.fetchval("SELECT hooks::text FROM ctx.summaries WHERE thread_id = $1", t.thread_id)
    assert [h["source"] for h in json.loads(stored)] == ["scope@1", "notes@2"]


async def test_purposes_filter_which_hooks_run_and_a_compaction_never_runs_action_hooks(
    fleet: Any, client: FleetClient, hook_service: HookService
) -> None:
    bindings = [
        await _hook(hook_service, "action", HookPoint.PREPARE_BEFORE, HookReply()),
        await _hook(
            hook_service, "completion", HookPoint.PREPARE_AFTER, HookReply(), purposes=[Purpose.COMPLETION]
        ),
        await _hook(hook_service, "scope", HookPoint.COMPACT_BEFORE, HookReply()),
        await _hook(hook_service, "notes", HookPoint.COMPACT_AFTER, HookReply()),
    ]
    t = await _working_thread(client, await _release(client, *bindings))
    assert [n for n, _ in hook_service.calls] == ["action"]  # the recording prepare is an action

    await client.prepare(_request(t, "task", purpose=Purpose.COMPLETION))
    await client.prepare(_request(t, "task", purpose=Purpose.COMPACTION))
    assert [n for n, _ in hook_service.calls] == ["action", "completion"]

    hook_service.calls.clear()
    await client.compact(_compact(t))
    assert [(n, c.purpose) for n, c in hook_service.calls] == [
        ("scope", Purpose.COMPACTION),
        ("notes", Purpose.COMPACTION),
    ]
    with pytest.raises(ValueError, match="cannot run for purpose compaction"):
        HookBinding(
            name="x",
            version="1",
            point=HookPoint.PREPARE_BEFORE,
            subject="hooks.default.x",
            purposes=(Purpose.COMPACTION,),
        )


@pytest.mark.parametrize("failure", [HookFailurePolicy.SKIP, HookFailurePolicy.FAIL])
async def test_a_compaction_hook_that_times_out_is_skipped_or_fails_the_job_by_its_policy(
    fleet: Any, client: FleetClient, hook_service: HookService, failure: HookFailurePolicy
) -> None:
    slow = await _hook(hook_service, "scope", HookPoint.COMPACT_BEFORE, None, timeout_ms=200, failure=failure)
    timeouts = _calls(fleet, "context.compact.before", "timeout")
    t = await _working_thread(client, await _release(client, slow))
    if failure is HookFailurePolicy.SKIP:
        # Compacted as if the hook had answered continue: it shaped nothing, so nothing names it.
        await client.compact(_compact(t))
        inspection = await client.inspect(t.thread_id, limit=1)
        assert (inspection.summaries, inspection.summary_hooks) == (1, ())
    else:
        with pytest.raises(CompactionFailed) as failed:
            await client.compact(_compact(t))
        assert failed.value.details["stage"] == "hook" and "hook_timeout" in failed.value.message
        assert (await client.inspect(t.thread_id, limit=1)).summaries == 0
    assert _calls(fleet, "context.compact.before", "timeout") == timeouts + 1
