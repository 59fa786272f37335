"""What a prepare is answered from: a view of the ledger as it stands when the prepare is served.

The rule, once (docs/design.md, "What a prepare is answered from"): every prepare loads its thread's
view from the ledger — one statement reading the head and whatever was recorded past the records
this process already holds — after any event it names is in the ledger. A prepare naming
``after_event_key`` asks in that same statement what became of the key, and until the ledger holds
it, asks again on every recorder or compactor notice of the thread and at least every ``RECHECK_S``;
notices only wake it. Nothing in a process's memory can say that a thread is current: so a prepare
never sees a view older than a commit its runtime had acknowledged, and five workers in one process
behave as five in five pods.
"""

from __future__ import annotations

import time

from services.app.notices import NoticeBoard, Pause, wait_for_notice
from services.app.views import ThreadView, ViewLoader
from contracts.exceptions import EventKeyConflict, EventRejected, NotYetRecorded
from services.store.ports import PrepareStore

__all__ = ["RECHECK_S", "view_after"]

# Notices are hints; a waiter asks the ledger at least this often even if one is lost.
RECHECK_S = 0.25


async def view_after(
    store: PrepareStore,
    loader: ViewLoader,
    board: NoticeBoard,
    *,
    tenant: str,
    thread_id: str,
    session_id: str,
    principal_id: str | None,
    event_key: str,
    event_hash: str | None,
    wait_ms: int,
    pause: Pause,
) -> ThreadView:
    """The view of ``tenant``'s ``thread_id`` read once the ledger holds ``event_key``: it holds it.

    ``EventRejected`` as soon as the key was refused, or was recorded with content other than
    ``event_hash`` (when given): the body the runtime named can then never be recorded under it.
    ``NotYetRecorded`` after ``wait_ms``. Another tenant's thread waits and times out exactly like a
    missing one; another session's or principal's is ``ThreadNotFound`` once the event is recorded.
    """
    started = time.monotonic()
    deadline = started + wait_ms / 1000
    # Registered before the first look, so a notice of the commit that lands in between is not missed.
    with board.waiting(thread_id) as woken:
        while True:
            woken.clear()
            async with store.connection() as session:
                view, outcome = await loader.load_naming(
                    session,
                    thread_id,
                    event_key,
                    tenant=tenant,
                    session_id=session_id,
                    principal_id=principal_id,
                )
                if outcome is None:  # no head yet, or another tenant's: the key may have been refused
                    outcome = await session.find_event_outcome(tenant, thread_id, event_key)
            if outcome.content_sha256 is not None:
                _ensure_named_content(event_key, event_hash, outcome.content_sha256)
                if view is not None:
                    return view
            if outcome.rejected is not None:
                raise EventRejected(event_key, *outcome.rejected)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NotYetRecorded(thread_id, event_key, int((time.monotonic() - started) * 1000))
            await wait_for_notice(woken, min(remaining, RECHECK_S), pause)


def _ensure_named_content(event_key: str, named: str | None, recorded: str) -> None:
    """Refuse a prepare whose event's key holds other content: the ledger records a key once (the
    recorder dead-letters the reused one as ``event_key_conflict``), so waiting cannot help."""
    if named is None or named == recorded:
        return
    conflict = EventKeyConflict(event_key, None)
    reason = f"{conflict.message} (recorded: {recorded}; named by the prepare: {named})"
    raise EventRejected(event_key, conflict.code.value, reason)
