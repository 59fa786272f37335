"""The WindowHandoff a closing window commits, and how the next window reads it. Pure.

Invariants:
1. The handoff names state paths, evidence and operations; it copies no value. The next window
   reads values from the state projection, so it shows the current value, never the one a later
   patch superseded.
2. Its id and checkpoint id are derived from the thread, the window and the state it closed at:
   the same rollover computed twice (a retry, a lost race) is the same handoff.
3. What it holds is sorted: the same state gives the same handoff, byte for byte.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from contracts import (
    AssistantMessagePayload,
    BlockKind,
    PathRule,
    Retention,
    ToolOutcomePayload,
)
from contracts.windows import RolloverTrigger, WindowHandoff

from services.core.compaction.files import files_of_call
from services.core.compaction.structured import error_line
from services.core.failures import failure_of
from services.core.groups import DraftBlock, user_block
from services.core.records import LedgerRecord
from services.core.state import Fact, StateView, state_hash
from services.core.windows.signals import operations_of, path_kind

__all__ = ["build_handoff", "handoff_block", "render_handoff"]

# Never change: handoff and checkpoint ids derived under it are stored in ctx.window_handoffs.
_HANDOFF_NS = uuid.UUID("0b8a9d52-6f3e-5c41-8e27-77696e646f77")
# The next window needs the state, not all of it: the newest facts beyond the kinds it always gets.
_MAX_PATHS = 40
# Files a task modified, across all its windows: the newest, when there are more.
_MAX_FILES = 60


def build_handoff(
    *,
    thread_id: str,
    run_id: str,
    previous_window: int,
    last_event_seq: int,
    state: StateView,
    window: Sequence[LedgerRecord],
    rules: Sequence[PathRule],
    trigger: RolloverTrigger,
    previous: WindowHandoff | None = None,
) -> WindowHandoff:
    """The handoff of window ``previous_window`` of ``thread_id``, closing after ``last_event_seq``.

    ``window`` is the closing window's own records (``signals.window_records``); ``rules`` the
    session catalog's path rules, which say which facts are goals, constraints and open questions.
    ``previous`` is the handoff that opened the closing window: its files carry forward.
    """
    # Every fact, conflicted and UNKNOWN ones too: they are state the next window must not guess.
    current = list(state.facts.values())
    by_kind: dict[str, list[Fact]] = {}
    for fact in current:
        by_kind.setdefault(path_kind(fact.path, rules), []).append(fact)
    goals = _paths(by_kind.get("goal", []))
    constraints = _paths(by_kind.get("constraint", []))
    questions = _paths(by_kind.get("open_question", []))
    always = set(goals) | set(constraints) | set(questions) | set(_paths(by_kind.get("plan", [])))
    newest = sorted((f for f in current if f.path not in always), key=lambda f: (-f.seq, f.path))
    required = sorted(always | {f.path for f in newest[: max(0, _MAX_PATHS - len(always))]})
    facts = {f.path: f for f in current}
    evidence = sorted(
        {e for p in required for e in facts[p].evidence} | {facts[p].event_key for p in required}
    )
    ops = operations_of(window)
    digest = state_hash(state)
    version = sum(state.versions.values())
    new_window = previous_window + 1
    return WindowHandoff(
        handoff_id=str(
            uuid.uuid5(_HANDOFF_NS, f"handoff/{thread_id}/{new_window}/{last_event_seq}/{digest}")
        ),
        thread_id=thread_id,
        task_id=run_id,
        previous_window=previous_window,
        new_window=new_window,
        trigger=trigger,
        state_version=version,
        state_hash=digest,
        last_event_seq=last_event_seq,
        active_goal_ids=goals,
        active_constraints=constraints,
        active_operations=tuple(sorted(set(ops.active))),
        unresolved_questions=questions,
        required_state_paths=tuple(required),
        required_evidence_ids=tuple(evidence),
        recent_receipt_ids=ops.recent,
        checkpoint_id=str(uuid.uuid5(_HANDOFF_NS, f"checkpoint/{thread_id}/{last_event_seq}/{digest}")),
        files_modified=_files_modified(window, previous.files_modified if previous else ()),
        last_failure=_last_failure(window, previous.last_failure if previous else None),
    )


def _files_modified(window: Sequence[LedgerRecord], earlier: Sequence[str]) -> tuple[str, ...]:
    order = list(earlier)
    for r in window:
        if isinstance(r.body, AssistantMessagePayload):
            for call in r.body.tool_calls:
                for path in files_of_call(call.name, call.args).modified:
                    if path in order:
                        order.remove(path)
                    order.append(path)
    return tuple(order[-_MAX_FILES:])


def _last_failure(window: Sequence[LedgerRecord], earlier: str | None) -> str | None:
    """The newest failed outcome of the task so far. Never cleared by a later success: a shell
    agent calls one tool for everything, so a success says nothing about what the failure was."""
    calls = {
        c.call_id: c for r in window if isinstance(r.body, AssistantMessagePayload) for c in r.body.tool_calls
    }
    last = earlier
    for r in window:
        if not isinstance(r.body, ToolOutcomePayload):
            continue
        call = calls.get(r.body.call_id)
        failure = failure_of(call, r.body.status, r.text)
        if failure is not None:
            line = failure.line if failure.shown_by == "output" else error_line(r.text)
            name = call.name if call is not None else "a tool"
            last = f"{name} (call {r.body.call_id}, record {r.seq}) {failure.status.value}: {line}"
    return last


def render_handoff(handoff: WindowHandoff) -> str:
    """The handoff as the next window's model reads it: what to carry on with and where it lives."""
    lines = [
        f"[window {handoff.new_window} — window {handoff.previous_window} closed after record "
        f"{handoff.last_event_seq} ({handoff.trigger.value}); its history stays in the ledger, readable "
        f"and searchable. Continue the task from the state below, not from memory of that window.]",
        f"state version {handoff.state_version}, checkpoint {handoff.checkpoint_id}",
    ]
    for title, items in (
        ("active goals", handoff.active_goal_ids),
        ("constraints", handoff.active_constraints),
        (
            "operations still unsettled (ask for their receipt before repeating them)",
            handoff.active_operations,
        ),
        ("unresolved questions", handoff.unresolved_questions),
        ("state this window needs (current values in the state block)", handoff.required_state_paths),
        ("evidence records", handoff.required_evidence_ids),
        ("recent receipts", handoff.recent_receipt_ids),
        ("files modified so far", handoff.files_modified),
    ):
        if items:
            lines.append(f"{title}: {', '.join(items)}")
    if handoff.last_failure is not None:
        lines.append(f"newest failure so far: {handoff.last_failure}")
    return "\n".join(lines)


def handoff_block(handoff: WindowHandoff) -> DraftBlock:
    """The handoff as a required block: stable for the whole window, so it sits in the cached prefix."""
    reason = f"window handoff {handoff.handoff_id} ({handoff.trigger.value}): what the closed window left"
    text = render_handoff(handoff)
    return user_block(f"handoff:{handoff.new_window}", BlockKind.STATE, Retention.REQUIRED, 0, reason, text)


def _paths(facts: Sequence[Fact]) -> tuple[str, ...]:
    return tuple(sorted(f.path for f in facts))
