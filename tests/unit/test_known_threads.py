"""What the recorder keeps of the threads it wrote: only what a plan of the thread's
next batch reads, only after plans that wrote nothing but their threads, bounded by a count."""

from __future__ import annotations

from typing import Any

from services.core.known_threads import KnownThreads
from services.core.ledger import (
    BatchPlan,
    Decoded,
    LedgerReads,
    RecordingLimits,
    Rejection,
    ThreadHead,
    decode_batch,
    plan_batch,
)
from services.core.runs import RunState, ThreadMeta
from services.core.tokens import counter_for
from tests.fixtures.builders import Thread, incoming

_LIMITS = RecordingLimits()
_COUNTERS = {"o200k_base": counter_for("o200k_base")}


def _decoded(events: list[Any], start: int) -> list[Decoded | Rejection]:
    return decode_batch(incoming(events, start_seq=start), _LIMITS)


def _commit(events: list[Any], reads: LedgerReads, known: KnownThreads, start: int) -> BatchPlan:
    plan = plan_batch(_decoded(events, start), reads, _LIMITS, _COUNTERS)  # type: ignore[arg-type]
    known.learn(reads, plan)
    return plan


def _read_after_first_event(t: Thread) -> LedgerReads:
    """What the store's read gives a thread's second batch: its head, session, run and thread."""
    return LedgerReads(
        heads={t.thread_id: ThreadHead(t.thread_id, t.session_id, 1, 1, "h1", "u1")},
        keys={},
        calls={},
        sessions={t.session_id: "default"},
        runs={t.run_id: RunState(t.run_id, t.session_id, "active", t.thread_id)},
        active_runs={t.session_id: t.run_id},
        threads={t.thread_id: ThreadMeta(t.thread_id, t.session_id, "main", None, 1)},
        principals={t.session_id: None},
        releases={t.session_id: None},
    )


def _known_thread(t: Thread, known: KnownThreads) -> None:
    """The thread's second batch (one assistant step) committed and learned."""
    _commit([t.assistant("ok", key="a1")], _read_after_first_event(t), known, start=2)


def test_a_new_threads_first_batch_is_not_learned() -> None:
    known = KnownThreads()
    t = Thread()
    # It creates its run and its thread: a plan that writes more than its thread.
    _commit([t.user("Fix app.py", key="u1")], LedgerReads({}, {}, {}), known, start=1)
    assert len(known) == 0


def test_a_step_that_wrote_only_its_thread_is_learned_with_its_open_calls() -> None:
    known = KnownThreads()
    t = Thread()
    step = t.assistant("looking", calls=(("c1", "ls", {}),), key="a1")
    _commit([step], _read_after_first_event(t), known, start=2)
    after = known.reads_for(_decoded([t.outcome("c1", "x", key="o1")], start=3))
    assert after is not None
    head = after.heads[t.thread_id]
    assert (head.revision, head.last_seq, head.last_event_key) == (2, 2, "a1")
    assert list(after.calls) == [(t.thread_id, "c1")] and after.calls[(t.thread_id, "c1")].outcome_seq is None
    assert after.threads[t.thread_id].last_seq == 2
    assert after.keys == {}  # a key recorded earlier is found by the write, never assumed unknown here


def test_a_closed_call_is_forgotten() -> None:
    known = KnownThreads()
    t = Thread()
    _commit(
        [t.assistant("looking", calls=(("c1", "ls", {}),), key="a1")], _read_after_first_event(t), known, 2
    )
    reads = known.reads_for(_decoded([t.outcome("c1", "x", key="o1")], start=3))
    assert reads is not None
    _commit([t.outcome("c1", "x", key="o1")], reads, known, start=3)
    after = known.reads_for(_decoded([t.user("next", key="u2")], start=4))
    assert after is not None and after.calls == {}


def test_a_plan_that_writes_more_than_its_thread_forgets_it() -> None:
    known = KnownThreads()
    t = Thread()
    _known_thread(t, known)
    reads = known.reads_for(_decoded([t.run_status("completed", key="end")], start=3))
    assert reads is not None
    _commit([t.run_status("completed", key="end")], reads, known, start=3)  # the run's status changes
    assert known.reads_for(_decoded([t.user("more", key="u2")], start=4)) is None


def test_a_batch_of_two_threads_or_naming_another_session_reads_the_ledger() -> None:
    known = KnownThreads()
    t, other = Thread(), Thread()
    _known_thread(t, known)
    assert known.reads_for(_decoded([t.user("more", key="u2")], start=3)) is not None
    assert known.reads_for(_decoded([t.user("more", key="u2"), other.user("hi")], start=3)) is None
    foreign = t.user("more", key="u3").model_copy(update={"session_id": "another-session"})
    assert known.reads_for(_decoded([foreign], start=3)) is None


def test_the_least_recently_written_threads_are_forgotten_beyond_the_bound() -> None:
    known = KnownThreads(capacity=2)
    threads = [Thread() for _ in range(3)]
    for t in threads:
        _known_thread(t, known)
    assert len(known) == 2
    asks = [_decoded([t.user("more", key="u2")], start=3) for t in threads]
    assert [known.reads_for(a) is not None for a in asks] == [False, True, True]
    known.forget([threads[1].thread_id])
    assert known.reads_for(asks[1]) is None


def test_a_batch_of_several_threads_teaches_nothing_and_forgets_them() -> None:
    known = KnownThreads()
    t, other = Thread(), Thread()
    _known_thread(t, known)
    # A backlog's batch: both threads move in one plan that writes nothing but them.
    both = _merged(_read_after_first_event(t), _read_after_first_event(other))
    plan = _commit([t.assistant("ok", key="a2"), other.assistant("ok", key="a1")], both, known, start=3)
    assert len(plan.heads) == 2 and not plan.rejections
    assert len(known) == 0


def _merged(a: LedgerReads, b: LedgerReads) -> LedgerReads:
    fields = {}
    for name in LedgerReads.__slots__:  # type: ignore[attr-defined]
        mine, theirs = getattr(a, name), getattr(b, name)
        fields[name] = {**mine, **theirs} if isinstance(mine, dict) else mine
    return LedgerReads(**fields)
