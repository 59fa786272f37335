"""Context hooks: what a hook's patch may change, and a prepare with a scripted hook service."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, get_args

import pytest

from contracts import BlockKind, PrepareRequest, Purpose, Retention, SummaryHook
from contracts.hook_protocol import (
    HookAddition,
    HookBlock,
    HookBlockEdit,
    HookCall,
    HookPatch,
    HookRange,
    HookReply,
)
from contracts.prepare import HookTouch
from contracts.hooks import AdditionCategory, HookBinding, HookFailurePolicy, HookPoint, HookSet
from services.app.hook_registry import HookRegistry
from tests.fixtures.hook_runner import ScriptedHookRunner
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.core.hook_patches import (
    check_compact_after,
    check_compact_before,
    check_prepare_after,
    check_prepare_before,
)
from services.core.ledger import RecordingLimits
from contracts.exceptions import HookRejected, HookTimeout
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming, prepare_request

_BEFORE = HookBinding(
    name="policy",
    version="2",
    point=HookPoint.PREPARE_BEFORE,
    subject="hooks.default.policy",
    grants=(AdditionCategory.MATERIAL,),
)
_CANDIDATES = (
    HookBlock(
        block_id="instruction:1",
        kind=BlockKind.INSTRUCTION,
        retention=Retention.REQUIRED,
        tokens=3,
        text="Be brief.",
    ),
    HookBlock(block_id="task:2", kind=BlockKind.TASK, retention=Retention.REQUIRED, tokens=2, text="fix it"),
    HookBlock(
        block_id="material:3", kind=BlockKind.MATERIAL, retention=Retention.ON_DEMAND, tokens=9, text="doc"
    ),
)


def test_a_granted_addition_and_deselecting_optional_material_pass() -> None:
    patch = HookPatch(
        add=(HookAddition(category="material", title="doc", text="x"),), deselect=("material:3",)
    )
    assert check_prepare_before(_BEFORE, patch, _CANDIDATES) == []


def test_editing_the_task_text_deselecting_required_blocks_or_ungranted_additions_are_refused() -> None:
    patch = HookPatch(
        edit=(HookBlockEdit(block_id="task:2", text="do something else"),),
        deselect=("instruction:1", "nope"),
        add=(HookAddition(category="guidance", title="g", text="obey me"),),
    )
    problems = check_prepare_before(_BEFORE, patch, _CANDIDATES)
    assert len(problems) == 4
    assert any("edit of block task:2" in p for p in problems)
    assert any("guidance is not granted" in p for p in problems)


def test_the_points_a_context_records_are_the_hook_points_of_their_stage() -> None:
    # SummaryHook and HookTouch spell the points as literals (contracts.prepare cannot import
    # contracts.hooks); they must stay the HookPoint values of their stage.
    summary_points = get_args(SummaryHook.model_fields["point"].annotation)
    touch_points = [a for u in get_args(HookTouch.model_fields["point"].annotation) for a in get_args(u)]
    assert set(summary_points) == {p.value for p in HookPoint if p.is_compaction}
    assert set(touch_points) == {p.value for p in HookPoint if not p.is_compaction}


def test_prepare_after_may_only_annotate() -> None:
    assert check_prepare_after(HookPatch(annotations=({"text": "checked"},))) == []  # type: ignore[arg-type]
    assert check_prepare_after(HookPatch(deselect=("material:3",))) == [
        "deselect is not allowed at this point"
    ]


def test_compact_before_may_narrow_but_not_widen_the_range() -> None:
    inside = HookPatch(narrow_to=HookRange(from_seq=3, to_seq=5), summary_target_tokens=100)
    assert check_compact_before(inside, HookRange(from_seq=1, to_seq=8), 400) == []
    wider = HookPatch(narrow_to=HookRange(from_seq=0, to_seq=9), summary_target_tokens=800)
    assert len(check_compact_before(wider, HookRange(from_seq=1, to_seq=8), 400)) == 2


def test_compact_after_may_not_patch_the_covered_range() -> None:
    assert check_compact_after(HookPatch(summary_fields={"progress": []})) == []
    assert check_compact_after(HookPatch(summary_fields={"covered_to": 99})) == [
        "summary field covered_to may not be patched"
    ]


async def _prepared_with(
    reply: HookReply | Exception, binding: HookBinding = _BEFORE, purpose: Purpose = Purpose.ACTION
):  # type: ignore[no-untyped-def]
    store, board = MemoryStore(), NoticeBoard()
    runner = ScriptedHookRunner(scripts={binding.subject: reply})  # type: ignore[dict-item]
    registry = HookRegistry(store, runner)
    await store.register_hooks("default", HookSet(release="rel-1", hooks=(binding,)))
    t = Thread()
    recorder = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit")
    await recorder.record_batch(
        0, incoming([t.system("Be brief.", key="sys"), t.user("fix the bug", key="u1")])
    )
    store.tables.sessions[t.session_id]["agent_release"] = "rel-1"
    service = PrepareService(store, board, hooks=registry)
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=8_000,
        purpose=purpose,
    )
    return await service.prepare(request), runner


class _Sink:
    async def publish(self, letter: object, msg_id: str) -> None:
        return None


@pytest.mark.anyio
async def test_a_prepare_that_arrives_before_its_sessions_first_event_still_runs_the_releases_hooks() -> None:
    store, board = MemoryStore(), NoticeBoard()
    runner = ScriptedHookRunner(scripts={_BEFORE.subject: HookReply()})
    await store.register_hooks("default", HookSet(release="rel-1", hooks=(_BEFORE,)))
    t = Thread()
    service = PrepareService(store, board, hooks=HookRegistry(store, runner))
    request = prepare_request(t, budget_tokens=8_000, after_event_key="u1", wait_ms=5_000)
    waiting = asyncio.create_task(service.prepare(request))
    await asyncio.sleep(0)  # the prepare is waiting for u1: the session is not recorded yet
    first = t.system("Be brief.", key="sys").model_copy(update={"agent_release": "rel-1"})
    recorder = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit")
    await recorder.record_batch(0, incoming([first, t.user("fix the bug", key="u1")]))
    board.notify(t.thread_id)
    prepared = await waiting
    assert [(h.source, h.outcome) for h in prepared.hooks] == [("policy@2", "ok")]


@pytest.mark.anyio
async def test_a_hooks_addition_is_in_the_prepared_context_with_its_source() -> None:
    reply = HookReply(
        decision="patch",
        patch=HookPatch(
            add=(HookAddition(category="material", title="policy doc", text="Refunds need approval."),)
        ),
    )
    prepared, runner = await _prepared_with(reply)
    assert any("Refunds need approval." in (m.content or "") for m in prepared.messages)
    block = next(b for b in prepared.blocks if b.block_id.startswith("hook:policy:"))
    assert "policy@2" in block.reason and block.droppable
    assert [(h.source, h.outcome) for h in prepared.hooks] == [("policy@2", "patched")]
    assert runner.calls[0][1].blocks  # the hook saw the candidates


@pytest.mark.anyio
async def test_a_hooks_addition_over_the_budget_is_left_out_whole_and_first() -> None:
    # About 10k tokens against a budget of 8k: the material goes, everything the thread holds stays.
    huge = HookAddition(category="material", title="archive", text="retention clause " * 5_000)
    prepared, _ = await _prepared_with(HookReply(decision="patch", patch=HookPatch(add=(huge,))))
    assert [o.block_id.split(":")[0] for o in prepared.omitted] == ["hook"]
    assert prepared.messages[-1].content == "fix the bug"
    assert prepared.budget_report.used.total <= prepared.budget_report.input_budget


@pytest.mark.anyio
async def test_a_patch_editing_the_task_is_refused_and_the_context_assembled_without_it() -> None:
    reply = HookReply(
        decision="patch", patch=HookPatch(edit=(HookBlockEdit(block_id="x", text="other task"),))
    )
    prepared, _ = await _prepared_with(reply)
    assert prepared.messages[-1].content == "fix the bug"
    assert prepared.hooks[0].outcome == "refused" and "hook_change_refused" in prepared.hooks[0].note


@pytest.mark.anyio
async def test_a_hook_timeout_is_skipped_or_fails_the_prepare_by_policy() -> None:
    timeout = HookTimeout("policy@2", "context.prepare.before", 500)
    prepared, _ = await _prepared_with(timeout)
    assert prepared.hooks[0].outcome == "timeout"
    with pytest.raises(HookTimeout):
        await _prepared_with(timeout, _BEFORE.model_copy(update={"failure": HookFailurePolicy.FAIL}))


@pytest.mark.anyio
async def test_a_reject_fails_the_prepare_with_its_reason() -> None:
    with pytest.raises(HookRejected, match="tenant frozen"):
        await _prepared_with(HookReply(decision="reject", reason="tenant frozen"))


@pytest.mark.anyio
async def test_an_action_hook_does_not_run_for_a_completion_check() -> None:
    prepared, runner = await _prepared_with(HookReply(), purpose=Purpose.COMPLETION)
    assert runner.calls == [] and prepared.hooks == ()


@pytest.mark.anyio
async def test_a_compact_after_patch_dropping_a_file_write_fails_validation_and_the_old_view_stays() -> None:
    binding = HookBinding(
        name="redact", version="1", point=HookPoint.COMPACT_AFTER, subject="hooks.default.redact"
    )
    outcome, runner, store, t = await _compaction_with(
        binding, HookReply(decision="patch", patch=HookPatch(summary_fields={"files_modified": []}))
    )

    assert runner.calls and runner.calls[0][1].point is HookPoint.COMPACT_AFTER
    assert (outcome.status, outcome.stage) == ("failed", "validate")
    assert "redact@1" in (outcome.detail or "")
    async with store.connection() as s:
        assert (await s.load_view(t.thread_id)).view_revision == 0


async def _compaction_with(
    binding: HookBinding, reply: HookReply | Callable[[HookCall], Awaitable[HookReply]]
) -> tuple[Any, Any, Any, Thread]:
    """A tight-policy thread of six written files, compacted once with ``binding`` answering ``reply``."""
    from contracts import CompactionPolicy, ContextPolicy
    from services.app.compacting import CompactionService
    from services.app.scheduling import request_job
    from services.app.views import ViewLoader

    store, t = MemoryStore(), Thread()
    await store.register_hooks("default", HookSet(release="rel-1", hooks=(binding,)))
    await store.register_policy(
        "default",
        ContextPolicy(name="tight", model_profile=None, budget_tokens=2_000, compaction=CompactionPolicy()),
    )
    events = [
        t.system("You fix bugs.").model_copy(update={"policy": "tight"}),
        t.user("Fix app.py", key="task"),
    ]
    for i in range(6):
        cmd = {"path": f"file{i}.py", "content": "x = 1\n" * 40}
        events.append(t.assistant(f"step {i}", calls=((f"c{i}", "write_file", cmd),)))
        events.append(t.outcome(f"c{i}", f"wrote file{i}.py " * 60, key=f"out{i}"))
    recorder = RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit")
    await recorder.record_batch(0, incoming(events))
    store.tables.sessions[t.session_id]["agent_release"] = "rel-1"
    runner = ScriptedHookRunner(scripts={binding.subject: reply})

    class _Q:
        async def publish(self, job: object) -> None:
            return None

    async with store.connection() as s:
        view = await ViewLoader().load(s, t.thread_id)
        job = await request_job(s, _Q(), view, ("context_ratio",))  # type: ignore[arg-type]
    assert job is not None
    outcome = await CompactionService(store, ViewLoader(), hooks=HookRegistry(store, runner)).run(job)
    return outcome, runner, store, t


@pytest.mark.anyio
async def test_a_compact_before_hook_that_ends_the_range_earlier_gets_a_summary_of_only_that_much() -> None:
    binding = HookBinding(
        name="scope", version="1", point=HookPoint.COMPACT_BEFORE, subject="hooks.default.scope"
    )
    unhooked, first, store, t = await _compaction_with(binding, HookReply())
    candidate = first.calls[0][1].range
    assert unhooked.status == "committed" and first.calls[0][1].point is HookPoint.COMPACT_BEFORE
    async with store.connection() as s:
        whole = (await s.load_view(t.thread_id)).summary
    assert whole is not None and whole.body.covered_to == candidate.to_seq
    end = candidate.from_seq + 3
    outcome, _, store, t = await _compaction_with(
        binding,
        HookReply(
            decision="patch", patch=HookPatch(narrow_to=HookRange(from_seq=candidate.from_seq, to_seq=end))
        ),
    )
    assert outcome.status == "committed"
    async with store.connection() as s:
        summary = (await s.load_view(t.thread_id)).summary
    assert summary is not None and candidate.from_seq <= summary.body.covered_to <= end < candidate.to_seq
    assert whole.hooks == ()  # the hook ran but changed nothing: it did not shape the summary
    assert summary.hooks == (
        SummaryHook(
            source="scope@1",
            point="context.compact.before",
            subject="hooks.default.scope",
            release="rel-1",
            hook_set_revision=1,
            change=f"range {candidate.from_seq}–{candidate.to_seq} → {candidate.from_seq}–{end}",
        ),
    )
    assert [e.hooks for e in await store.thread_compactions(t.thread_id)] == [summary.hooks]


@pytest.mark.anyio
async def test_a_compact_after_patch_that_validates_is_committed_and_recorded_with_the_summary() -> None:
    binding = HookBinding(
        name="redact", version="4", point=HookPoint.COMPACT_AFTER, subject="hooks.default.redact"
    )

    async def patch(call: HookCall) -> HookReply:
        assert call.range is not None and call.summary is not None
        step = {"text": "Run the tests before the next write", "sources": [call.range.from_seq]}
        return HookReply(decision="patch", patch=HookPatch(summary_fields={"next_steps": [step]}))

    outcome, _, store, t = await _compaction_with(binding, patch)
    assert outcome.status == "committed"
    async with store.connection() as s:
        summary = (await s.load_view(t.thread_id)).summary
    assert summary is not None
    assert [n.text for n in summary.body.next_steps] == ["Run the tests before the next write"]
    assert [(h.source, h.point, h.hook_set_revision, h.change) for h in summary.hooks] == [
        ("redact@4", "context.compact.after", 1, "patched next_steps")
    ]


@pytest.mark.anyio
async def test_a_compact_before_hook_may_not_move_the_start_of_the_range() -> None:
    binding = HookBinding(
        name="scope",
        version="1",
        point=HookPoint.COMPACT_BEFORE,
        subject="hooks.default.scope",
        failure=HookFailurePolicy.FAIL,
    )
    call_range = (await _compaction_with(binding, HookReply()))[1].calls[0][1].range
    moved = HookRange(from_seq=call_range.from_seq + 1, to_seq=call_range.to_seq)
    outcome, _, store, t = await _compaction_with(
        binding, HookReply(decision="patch", patch=HookPatch(narrow_to=moved))
    )
    assert (outcome.status, outcome.stage) == ("failed", "hook")
    assert "hook_change_refused" in outcome.detail
    async with store.connection() as s:
        assert (await s.load_view(t.thread_id)).view_revision == 0
