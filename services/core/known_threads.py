"""What the recorder knows of the threads it wrote last, so an agent's next step is planned without
reading the ledger first (design D14.23).

Every batch read what its plan needs (heads, keys, calls, sessions, runs, state, catalogs, the
position) in one round trip before planning: ~1.3 ms of a read-your-writes step after an agent's
pause, with its decoding. For a thread this process just wrote, the answer is already known — what it
read then, moved by what it wrote — except where another writer could have changed it since, and each
of those is checked by the write itself, inside its one statement:

- the head: only its own thread's writes move it, each compare-and-setting its revision;
- the thread's calls and their outcomes: written only with a move of that head; a call this process
  does not know is unknown to the plan, which rejects what names it, and a rejection is never decided
  here (the batch is then read and planned again); a new call id stored earlier fails its insert;
- event keys: none is assumed known; a key recorded earlier fails the records' unique index;
- the partition's position: the write checks it (``ctx.require_position``);
- a known session's tenant, principal, release and pinned catalog never change (they are set by the
  batch that creates it); a run's status changes only with its main thread's records; a thread's role
  and parent never change; its state changes only by plans that are not learned here (state writes).

So a step planned from this knowledge commits exactly what a step planned from a read would have, or
its statement fails and nothing of it stays; the recorder then reads and plans again, as a batch that
lost a race does. Only plans that write nothing but their threads (``writes_only_its_threads``) are
learned, from batches of one thread, and only batches of one known thread are planned from them: a
backlog reads as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from services.core.ledger import (
    BatchPlan,
    CallState,
    Decoded,
    HeadWrite,
    LedgerReads,
    Rejection,
    ThreadHead,
    writes_only_its_threads,
)

__all__ = ["KnownThreads"]


class KnownThreads:
    """The reads a next batch of each recently written thread would make, bounded by a thread count
    (least recently written forgotten first)."""

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._threads: OrderedDict[str, LedgerReads] = OrderedDict()

    def __len__(self) -> int:
        return len(self._threads)

    def reads_for(self, decoded: Sequence[Decoded | Rejection]) -> LedgerReads | None:
        """The reads of a batch whose every event is on one known thread and in its session; ``None``
        when the batch must read the ledger."""
        thread_id: str | None = None
        for item in decoded:
            if isinstance(item, Rejection) or thread_id not in (None, item.subject_thread):
                return None
            thread_id = item.subject_thread
        known = self._threads.get(thread_id) if thread_id is not None else None
        if known is None or thread_id is None:
            return None
        session_id = known.heads[thread_id].session_id
        if any(isinstance(d, Decoded) and d.event.session_id != session_id for d in decoded):
            return None
        return known

    def learn(self, reads: LedgerReads, plan: BatchPlan) -> None:
        """After ``plan`` committed on ``reads``: what the one thread it moved looks like now; the
        threads of a plan that moved several or wrote more than its threads are forgotten. A backlog's
        batches hold many threads, and what they would teach is rarely used: their next batches hold
        many threads too, and knowing them cost 15–20 µs a thread."""
        learnable = len(plan.heads) == 1 and writes_only_its_threads(plan)
        for head in plan.heads:
            after = _after(reads, plan, head) if learnable else None
            if after is None:
                self._threads.pop(head.thread_id, None)
                continue
            self._threads[head.thread_id] = after
            self._threads.move_to_end(head.thread_id)
        while len(self._threads) > self._capacity:
            self._threads.popitem(last=False)

    def forget(self, thread_ids: Sequence[str]) -> None:
        """Drop what is known of ``thread_ids`` (a batch of theirs failed: its outcome is not known)."""
        for thread_id in thread_ids:
            self._threads.pop(thread_id, None)


def _after(reads: LedgerReads, plan: BatchPlan, head: HeadWrite) -> LedgerReads | None:
    """The reads of ``head``'s thread once ``plan`` committed; ``None`` when ``reads`` lacks part of it."""
    thread_id, session_id = head.thread_id, head.session_id
    meta = reads.threads.get(thread_id)
    run = reads.runs.get(head.run_id)
    if head.expected_revision is None or meta is None or run is None or session_id not in reads.sessions:
        return None
    calls = {k: c for k, c in reads.calls.items() if k[0] == thread_id and c.outcome_seq is None}
    for call in plan.calls:
        if call.thread_id == thread_id:
            calls[(thread_id, call.call_id)] = CallState(
                call.call_id, call.call_seq, None, call.name, call.args
            )
    for outcome in plan.outcomes:
        # A closed call is forgotten: an outcome naming it again is then unknown, so it is read.
        calls.pop((thread_id, outcome.call_id), None)
    threads = {thread_id: replace(meta, last_seq=head.last_seq)}
    parent = reads.threads.get(meta.parent_thread_id or "")
    if parent is not None:
        threads[parent.thread_id] = parent  # its last_seq only ever grows: an export it allows stays allowed
    return LedgerReads(
        heads={
            thread_id: ThreadHead(
                thread_id, session_id, head.revision, head.last_seq, head.last_hash, head.last_event_key
            )
        },
        keys={},
        calls=calls,
        sessions={session_id: reads.sessions[session_id]},
        runs={run.run_id: run},
        active_runs={session_id: a} if (a := reads.active_runs.get(session_id)) is not None else {},
        threads=threads,
        principals={session_id: reads.principals.get(session_id)},
        releases={session_id: reads.releases.get(session_id)},
        states={thread_id: s} if (s := reads.states.get(thread_id)) is not None else {},
        catalogs={session_id: c} if (c := reads.catalogs.get(session_id)) is not None else {},
    )
