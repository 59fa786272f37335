"""The recorder's service: one fetched batch in, one Postgres transaction out.

Optimistic: read what the batch touches, plan every write with no lock held (tokenizing is the
expensive part), then write in one transaction that compare-and-sets each thread head. A moved head
or a key recorded meanwhile means another writer got there first: re-read and re-plan.

No event can stop its partition. A failure that waiting cannot fix — a value PostgreSQL refuses, a
planner bug one event trips, any exception the recording did not foresee — would fail every retry
alike, so the batch is split in halves, each applied in order on fresh reads, until the one event at
fault is alone. That event is tried again on fresh reads, and after ``_ALONE_ATTEMPTS`` in all it is
dead-lettered ``unstorable_event`` (logged once, with the traceback) while every other event is
recorded once, in order: a later event of its thread is planned as if it had never been published,
as after any rejected event. Failures of the store or the broker themselves (lost connections, a
missing table, a full disk, a revision race) are not the events' fault: they propagate and the worker
retries, so an outage never turns valid events into dead letters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Literal, Protocol, TypeAlias

from contracts import DeadLetter, decode_event
from contracts.subjects import thread_from_partitioned_subject

from contracts.exceptions import (
    CtxError,
    DuplicateEvent,
    PositionRegressed,
    RevisionConflict,
    StoreRejected,
    UnstorableEvent,
)
from services.core.hashing import sha256_hex
from services.killpoints import kill_point
from services.core.ledger import (
    BatchPlan,
    batch_keys,
    Decoded,
    Incoming,
    LedgerReads,
    RecordingLimits,
    Rejection,
    decode_batch,
    encode_raw,
    plan_steps,
    readable_event_key,
    run_steps,
    texts_to_count,
)
from services.app.step_timing import RecordStages, ignore_stage
from services.store.ports import Position, RecordingStore
from services.core.tokens import CountAhead, EncodingName, TokenCounter, counter_for, knowing

__all__ = ["BatchResult", "DeadLetterSink", "RecordingService", "dead_letter_of"]

log = logging.getLogger("ctxfleet.recorder")

_MAX_ATTEMPTS = 4
# An event that fails alone is tried this many times in all, each on fresh reads, before it is set
# aside: a failure a fresh read does not repeat (one tripped by what the recorder remembered of its
# thread) is not blamed on the event.
_ALONE_ATTEMPTS = 3
# How long planning holds the event loop before it gives other work a turn.
_PLAN_SLICE_S = 0.001
# A batch with this much text (~1.5 ms of tiktoken) is counted on the counting thread before its plan.
_COUNT_AHEAD_CHARS = 16_384
_CAUSE_CHARS = 300
# The steps of an attempt that handle the events' values, named in an unstorable event's details;
# ``record`` is anywhere else in recording a batch (a failure the steps did not foresee).
_Stage: TypeAlias = Literal["decode", "read", "plan", "write", "record"]


class DeadLetterSink(Protocol):
    """Where rejected events go (the dead-letter subject); must be idempotent per ``msg_id``."""

    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        """Publish one dead letter."""


@dataclass(frozen=True)
class BatchResult:
    """What a batch did, for acks, notices and metrics."""

    heads: Mapping[str, tuple[int, int]]
    recorded: int
    rejections: tuple[Rejection, ...]
    duplicates: int
    skipped: int
    attempts: int


def dead_letter_of(rejection: Rejection, keep_bytes: int) -> DeadLetter:
    """The wire form of a rejection."""
    raw = rejection.incoming.data
    b64, truncated = encode_raw(raw, keep_bytes)
    return DeadLetter(
        code=rejection.code,
        reason=rejection.reason,
        details=rejection.details,
        subject=rejection.incoming.subject,
        thread_id=rejection.thread_id,
        event_key=rejection.event_key,
        stream_seq=rejection.incoming.stream_seq,
        raw_size=len(raw),
        raw_sha256=sha256_hex(raw),
        raw_base64=b64,
        raw_truncated=truncated,
    )


class RecordingService:
    """Records batches of one partition of the events stream."""

    def __init__(
        self,
        store: RecordingStore,
        sink: DeadLetterSink,
        *,
        limits: RecordingLimits,
        recorder_id: str,
        consumer: str = "recorder",
        on_stage: RecordStages = ignore_stage,
    ) -> None:
        self._store = store
        # Told each attempt's read, plan and write seconds as they end (services/app/step_timing.py).
        self._on_stage = on_stage
        self._sink = sink
        self._limits = limits
        self._recorder_id = recorder_id
        self._consumer = consumer
        # o200k only: cl100k counts are deferred to the readers whose profile needs them.
        self._counters: dict[EncodingName, TokenCounter] = {"o200k_base": counter_for("o200k_base")}
        self._counting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctx-count")
        # numpy's import (~0.1 s) on the thread now, not in the first large batch's wait.
        self._counting.submit(CountAhead.warm_up, self._counters["o200k_base"])

    async def record_batch(
        self, partition: int, batch: Sequence[Incoming], *, committed: int | None = None
    ) -> BatchResult:
        """Apply a batch exactly once, in order, setting aside any event that cannot be applied.

        ``committed``: the position this reader last saw committed for the partition (read when it
        bound its consumer, then each batch's end). Its commits do not wait for the WAL flush
        (docs/design.md, "The recorder's commits do not wait for the WAL flush"), so a store that crashed
        meanwhile may hold an older one; the batch is then
        refused with PositionRegressed instead of applied over the gap, and the reader starts again
        from what the store holds.

        Only failures that waiting can fix propagate (what is recorded so far stays, and the retry
        skips it); any other failure sets the event at fault aside.

        Raises:
            StoreUnavailable: the store cannot be reached; the worker retries the batch.
            RevisionConflict: another writer kept moving the heads through every attempt.
            PositionRegressed: the store's position is behind ``committed``; nothing was written.
            StoreUnavailable: also for a failure of the store that no event caused (a missing table,
                a full disk), so the worker retries rather than dead-letter valid events.
            FleetUnavailable: the sink could not publish a dead letter (a broker outage); the
                worker retries the batch.
        """
        parts = await self._record_isolating(partition, list(batch), committed)
        return _merge(parts)

    async def _record_isolating(
        self, partition: int, batch: list[Incoming], committed: int | None
    ) -> list[BatchResult]:
        """The batch, or, if its content cannot be applied, its halves in order until the culprit is alone."""
        try:
            return [await self._record_retrying(partition, batch, committed)]
        except Exception as exc:
            # No wrapper around the attempt: a batch that succeeds costs no frame more.
            if (failure := _unappliable(exc)) is None:
                raise
            if len(batch) == 1:
                return [await self._record_alone(partition, batch[0], committed, failure)]
            # Said once, with its traceback, when the event at fault is set aside.
            log.debug(
                "partition %s: seq %d..%d cannot be applied (%s: %s); isolating the event at fault",
                partition,
                batch[0].stream_seq,
                batch[-1].stream_seq,
                failure.stage,
                type(failure.cause).__name__,
            )
        half = len(batch) // 2
        # In order, each half on fresh reads: the second sees what the first committed, as in one batch.
        first = await self._record_isolating(partition, batch[:half], committed)
        return [*first, *await self._record_isolating(partition, batch[half:], committed)]

    async def _record_alone(
        self, partition: int, incoming: Incoming, committed: int | None, failure: _Unappliable
    ) -> BatchResult:
        """One event that failed alone: tried again on fresh reads, then set aside if it still fails."""
        attempts = 1
        while attempts < _ALONE_ATTEMPTS:
            attempts += 1
            try:
                return await self._record_retrying(partition, [incoming], committed)
            except Exception as exc:
                if (again := _unappliable(exc)) is None:
                    raise
                failure = again
        return await self._set_aside(partition, incoming, failure, attempts)

    async def _record_retrying(
        self, partition: int, batch: Sequence[Incoming], committed: int | None
    ) -> BatchResult:
        # Each step that handles the events' values is guarded; the store has already translated
        # its errors, so a redelivered key or a lost connection keeps its own meaning.
        with _content_failures("decode"):
            decoded = decode_batch(batch, self._limits)
        # Counted once for every attempt, and before a connection is taken: a batch waiting for the
        # counting thread must not hold one of the pool's connections meanwhile.
        with _content_failures("plan"):
            counters = await self._counters_for(decoded)
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                return await self._attempt(partition, batch, decoded, counters, attempt, committed)
            except (RevisionConflict, DuplicateEvent):
                if attempt == _MAX_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    async def _attempt(
        self,
        partition: int,
        batch: Sequence[Incoming],
        decoded: list[Decoded | Rejection],
        counters: Mapping[EncodingName, TokenCounter],
        attempt: int,
        committed: int | None,
    ) -> BatchResult:
        started = time.perf_counter()
        async with self._store.connection() as store:
            with _content_failures("read"):
                # The partition's position comes with the batch's reads: one round trip, not two.
                reads = await store.read_for_batch(batch_keys(decoded), tracking=(self._consumer, partition))
            read = time.perf_counter()
            self._on_stage("read", read - started)
            applied = reads.tracked
            if committed is not None and applied < committed:
                raise PositionRegressed(partition, committed, applied)
            fresh = [m for m in batch if m.stream_seq > applied]
            if not fresh:
                return BatchResult({}, 0, (), 0, len(batch), attempt)
            if len(fresh) < len(batch):  # a redelivery of what is applied already: plan only the rest
                decoded = [d for d in decoded if d.incoming.stream_seq > applied]
            with _content_failures("plan"):
                plan = await self._plan(decoded, reads, counters)
            planned = time.perf_counter()
            self._on_stage("plan", planned - read)
            for rejection in plan.rejections:
                await self._sink.publish(
                    dead_letter_of(rejection, self._limits.dead_letter_keep_bytes), _dead_msg_id(rejection)
                )
            with _content_failures("write"):
                # The position moves in the statement that writes the records.
                await store.write_plan(
                    plan,
                    recorded_by=self._recorder_id,
                    keep_raw=self._limits.dead_letter_keep_bytes,
                    position=Position(self._consumer, partition, fresh[-1].stream_seq),
                    before_commit=_before_commit if plan.records else None,
                )
            self._on_stage("write", time.perf_counter() - planned)
            if plan.records:
                kill_point("record.after_commit")
        return _result(plan, skipped=len(batch) - len(fresh), attempt=attempt)

    async def _counters_for(
        self, decoded: Sequence[Decoded | Rejection]
    ) -> Mapping[EncodingName, TokenCounter]:
        """The counters the plan of ``decoded`` uses: answering a large batch's texts from a count
        made ahead on the counting thread; an agent's step is counted in its plan as before, where a
        thread hop costs more than it saves.

        Counting is a third of the recorder's CPU per event in a backlog; on the loop, all of it would
        wait there. tiktoken releases the GIL while it encodes, so on the thread the count runs on
        the other core while this loop plans and writes other partitions' batches.
        One thread, and one tiktoken call per batch (``CountAhead``): threads that each want the GIL
        back often made the loop wait for it (docs/design.md, "Less CPU per recorded event and per indexed
        record").
        """
        job = CountAhead(self._counters["o200k_base"], texts_to_count(decoded))
        if job.chars < _COUNT_AHEAD_CHARS:
            return self._counters
        try:
            await asyncio.get_running_loop().run_in_executor(self._counting, job.encode)
            known = job.known(ids_over=self._limits.tool_result_max_tokens)
        except Exception as exc:  # only a shortcut failed: the plan counts every text itself, as before
            log.warning("counting a batch ahead failed (%s: %s); its plan counts it", type(exc).__name__, exc)
            return self._counters
        return {"o200k_base": knowing(self._counters["o200k_base"], known)}

    async def _plan(
        self,
        decoded: list[Decoded | Rejection],
        reads: LedgerReads,
        counters: Mapping[EncodingName, TokenCounter],
    ) -> BatchPlan:
        """Plan on this loop, giving it a turn about every millisecond: a backlog batch takes tens of
        milliseconds to plan, and a prepare that arrives meanwhile is served between two events. The
        plan is pure, so the pauses change nothing but when it is ready.

        Not in a worker thread: most of a plan is Python holding the GIL, and handing the GIL back and
        forth between the loop and the planning threads cost more than the overlap bought: the fleet's
        CPU per recorded event went from 460–600 µs to 300–380 without the thread (docs/design.md, "Less
        CPU per recorded event and per indexed record"). Only
        a large batch's count, which releases the GIL, runs on a thread (``_counters_for``)."""
        steps = plan_steps(decoded, reads, self._limits, counters)
        while True:
            ends = time.perf_counter() + _PLAN_SLICE_S
            plan = run_steps(steps, until=partial(_past, ends))
            if plan is not None:
                return plan
            await asyncio.sleep(0)

    async def _set_aside(
        self, partition: int, incoming: Incoming, failure: _Unappliable, attempts: int
    ) -> BatchResult:
        """Dead-letter the one event that cannot be applied and move the position past it.

        Its dead letter is built only from text the store can hold, so a failure to store it is the
        store's (retried by the worker, nothing moved), never the event's.
        """
        rejection = _unstorable(incoming, failure, self._limits.max_event_bytes)
        async with self._store.connection() as store:
            if await store.max_tracking_seq(self._consumer, partition) >= incoming.stream_seq:
                return BatchResult({}, 0, (), 0, 1, attempts)
            await self._sink.publish(
                dead_letter_of(rejection, self._limits.dead_letter_keep_bytes), _dead_msg_id(rejection)
            )
            async with store.transaction():
                await store.insert_dead_letter(rejection, keep_raw=self._limits.dead_letter_keep_bytes)
                await store.insert_tracking(self._consumer, partition, incoming.stream_seq)
        # Once it is stored: a retry through an outage meanwhile would otherwise say it again.
        log.error(
            "partition %s: seq %d (thread %s, key %s) failed %d times alone and is set aside as %s: %s",
            partition,
            incoming.stream_seq,
            rejection.thread_id,
            rejection.event_key,
            attempts,
            rejection.code.value,
            rejection.reason,
            exc_info=failure.cause,
        )
        return BatchResult({}, 0, (rejection,), 0, 0, attempts)


def _past(instant: float) -> bool:
    return time.perf_counter() >= instant


class _Unappliable(Exception):
    """The batch's own content made a step fail: retrying the same batch would fail the same way."""

    def __init__(self, stage: _Stage, cause: Exception) -> None:
        super().__init__(f"{stage}: {type(cause).__name__}: {_text_of(cause)}")
        self.stage = stage
        self.cause = cause


def _is_content_failure(exc: Exception) -> bool:
    """True when the values of the batch, not the state of the store or the broker, made a step fail."""
    if isinstance(exc, CtxError):
        # Retryable errors (StoreUnavailable: the store's state, not the values) and
        # DuplicateEvent already have their own handling; StoreRejected blames the values sent.
        return not exc.retryable and not isinstance(exc, DuplicateEvent)
    # Out of memory, or the operating system failing a call (a socket, a timeout): not the values.
    if isinstance(exc, (MemoryError, OSError)):
        return False
    # Python raising on a value (UnicodeEncodeError, ValueError, OverflowError, RecursionError…), in
    # pure planning or while asyncpg encodes a parameter, or a bug one event trips (KeyError,
    # AssertionError…): the same input fails the same way again.
    return True


def _unappliable(exc: Exception) -> _Unappliable | None:
    """What a failed attempt at a batch means: ``_Unappliable`` when retrying it cannot help, ``None``
    when it must propagate for the worker to retry (an outage, a race, a regressed position)."""
    if isinstance(exc, _Unappliable):
        return exc
    if isinstance(exc, DuplicateEvent):
        # Through every fresh read of the attempts: the reads miss what the write meets, which no
        # wait changes.
        return _Unappliable("write", exc)
    if _is_content_failure(exc):
        return _Unappliable("record", exc)
    return None


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, which a foreign exception may fail to produce."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__} that cannot be printed>"


@contextmanager
def _content_failures(stage: _Stage) -> Iterator[None]:
    """Re-raise a failure the batch's content caused as ``_Unappliable``; others unchanged."""
    try:
        yield
    except Exception as exc:
        if _is_content_failure(exc):
            raise _Unappliable(stage, exc) from exc
        raise


def _unstorable(incoming: Incoming, failure: _Unappliable, max_bytes: int) -> Rejection:
    """The dead letter of an event that cannot be applied, built only from text that is safe to store."""
    cause = failure.cause
    if isinstance(cause, StoreRejected):
        # Named after the server's refusal, not its translation: that is what an operator looks up.
        error = UnstorableEvent(
            failure.stage,
            str(cause.details["error"]),
            _printable(cause.cause)[:_CAUSE_CHARS],
            str(cause.details["sqlstate"]),
        )
    else:
        error = UnstorableEvent(
            failure.stage, type(cause).__name__, _printable(_text_of(cause))[:_CAUSE_CHARS], None
        )
    subject = _printable(incoming.subject)
    thread_id = thread_from_partitioned_subject(subject)
    event_key: str | None = None
    try:
        # Best effort, so a prepare waiting for this key learns of the rejection at once.
        event_key = decode_event(incoming.data, max_bytes=max_bytes).event_key
    except Exception:  # whatever made the event unstorable may also make it undecodable
        event_key = readable_event_key(incoming, thread_id)
    return Rejection(
        Incoming(subject, incoming.data, incoming.stream_seq),
        thread_id,
        event_key,
        error.code,
        error.message,
        error.details,
    )


def _printable(text: str) -> str:
    """``text`` with what PostgreSQL text and JSON cannot hold (NUL, lone surrogates) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def _merge(parts: Sequence[BatchResult]) -> BatchResult:
    """One result for a batch applied in parts; later heads win, as they were committed later."""
    heads: dict[str, tuple[int, int]] = {}
    for part in parts:
        heads.update(part.heads)
    return BatchResult(
        heads=heads,
        recorded=sum(p.recorded for p in parts),
        rejections=tuple(r for p in parts for r in p.rejections),
        duplicates=sum(p.duplicates for p in parts),
        skipped=sum(p.skipped for p in parts),
        attempts=sum(p.attempts for p in parts),
    )


def _before_commit() -> None:
    kill_point("record.before_commit")


def _dead_msg_id(rejection: Rejection) -> str:
    return f"dead:{rejection.incoming.stream_seq}:{sha256_hex(rejection.incoming.data)[:16]}"


def _result(plan: BatchPlan, *, skipped: int, attempt: int) -> BatchResult:
    return BatchResult(
        heads={h.thread_id: (h.last_seq, h.revision) for h in plan.heads},
        recorded=len(plan.records),
        rejections=plan.rejections,
        duplicates=len(plan.duplicates),
        skipped=skipped,
        attempts=attempt,
    )
