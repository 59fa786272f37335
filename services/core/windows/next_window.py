"""The next window's context: state projection + plan + handoff + evidence + the current turn. Pure.

After a rollover the view shows none of the closed window's interactions — they stay in the ledger,
readable and searchable — only what is never covered (instructions, material), the run's task, the
current request, the handoff and the state, and what was recorded since. The offline evaluation
runs a rollover rung through the same function the assembler uses (``next_window_snapshot``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from contracts import PathRule
from contracts.windows import RolloverTrigger, WindowHandoff

from services.core.assemble import ThreadSnapshot
from services.core.state import StateView
from services.core.windows.handoff import build_handoff
from services.core.windows.signals import window_records

__all__ = ["next_window_snapshot", "roll_over", "window_of"]


def next_window_snapshot(snapshot: ThreadSnapshot, handoff: WindowHandoff) -> ThreadSnapshot:
    """``snapshot`` as the window ``handoff`` opened sees it: nothing of the closed window's history."""
    covered = max(snapshot.covered_to, handoff.last_event_seq)
    summary = snapshot.summary
    if summary is not None and summary.covered_to <= handoff.last_event_seq:
        summary = None  # it only retold the closed window: the handoff and state replace it
    return replace(snapshot, covered_to=covered, summary=summary, window=handoff.new_window, handoff=handoff)


def roll_over(
    snapshot: ThreadSnapshot,
    *,
    window: int,
    opened_after: int,
    state: StateView,
    rules: Sequence[PathRule],
    trigger: RolloverTrigger,
) -> tuple[WindowHandoff, ThreadSnapshot]:
    """Close window ``window`` (opened after session seq ``opened_after``) at the snapshot's newest
    record: its handoff, and the snapshot of the window it opens."""
    last = max((r.seq for r in snapshot.records), default=opened_after)
    handoff = build_handoff(
        thread_id=snapshot.own_thread,
        run_id=snapshot.run_id,
        previous_window=window,
        last_event_seq=last,
        state=state,
        window=window_records(snapshot.records, opened_after, snapshot.own_thread),
        rules=rules,
        trigger=trigger,
        previous=snapshot.handoff,
    )
    return handoff, next_window_snapshot(snapshot, handoff)


def window_of(seq: int, closed_after: Sequence[int]) -> int:
    """The window a record of session seq ``seq`` belongs to, given where each window closed."""
    return 1 + sum(1 for last in closed_after if seq > last)
