"""recorder: applies each owned partition of the events stream to the ledger, in order.

Why not a FastStream subscriber: FastStream 0.7.8's batch pull loop keeps fetching until the batch
is full or its timeout passes (a latency floor on every prepare), and its per-message pull loop
handles a fetched batch concurrently (no order). Here each partition is read by an ephemeral,
ack-less pull consumer that starts right after the position committed in Postgres, through one pull
request kept open (``workers/pull.py``: a batch is what has arrived, never held back waiting for
more).

What holds, per partition:

1. Each batch is one transaction that also advances the partition's position. Postgres, not the
   broker, is the source of truth for what was applied: a crash replays from the last commit, a
   delivery gap (consumer sequence jump) rebuilds the consumer from it, and nothing is applied twice
   or out of order.
2. Positions are only meaningful for the stream they were read from: a ``StreamGuard`` checks, on
   start, after binding each consumer, when a fetch comes back idle and every couple of seconds while
   busy, that the events stream has not gone backwards or been re-created. If it has, every partition
   stops (they share one sequence space) and stays stopped, unready, until ``ctxfleet rebaseline``.
3. Only a failure that waiting can fix is retried, with a backoff, for as long as it lasts (the store
   or the broker out, a revision race, a regressed position), so an outage never loses or
   dead-letters a valid event; it is logged when it starts, when it changes and when it ends, not at
   each retry. Any other failure of a batch is one event's: that event is found, tried alone a few
   times, then dead-lettered ``unstorable_event`` with its raw payload (logged once with its
   traceback, counted in ``ctx_recorder_events_unstorable_total``), and the partition moves on with
   the events after it (``services/app/recording.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Sequence

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from contracts.subjects import (
    EVENTS_STREAM,
    dead_subject,
    partition_filter,
    recorded_subject,
)
from contracts import DeadLetter, ErrorCode, reply_json
from contracts.exceptions import CtxError, FleetUnavailable, StoreUnavailable
from services.core.ledger import Incoming, RecordingLimits
from services.app.recording import BatchResult, RecordingService
from services.store.postgres import PgStore

from .metrics import FleetMetrics
from .pull import ContinuousPull
from .refusals import Refusals, describe_publish_failure
from .stream_guard import DEFAULT_CHECK_EVERY_S, StreamGuard

__all__ = ["JetStreamDeadLetterSink", "RecorderWorker"]

log = logging.getLogger("ctxfleet.recorder")
# How long a partition waits for an event before it checks the stream again (the pull stays open).
_IDLE_CHECK_S = 1.0
# Short: deterministic failures no longer retry (they are dead-lettered), so only outages wait here,
# and recovery after one should not lag it by more than a couple of seconds.
_MAX_BACKOFF_S = 2.0
_STOP_GRACE_S = 2.0
# A JetStream API call (stream info, consumer create) the server does not answer — its stream has no
# leader while the replicas of a cluster elect one — is given up and retried this soon; the partitions
# wait for the guard's check, so with 10 s a failover took the election plus twice that.
_API_TIMEOUT_S = 3.0
# How often a failure of the events stream's check that keeps repeating is said again.
_CHECK_FAILED_LOG_EVERY_S = 60.0


class JetStreamDeadLetterSink:
    """Publishes dead letters to ``ctx.dead.events.<thread>`` (the CTX_DEAD stream), deduplicated by id."""

    def __init__(self, js: JetStreamContext, refusals: Refusals) -> None:
        self._js = js
        self._refusals = refusals

    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        """Store one dead letter durably (the batch is retried if JetStream does not take it)."""
        try:
            await self._js.publish(
                dead_subject(letter.thread_id),
                reply_json(letter),
                headers={"Nats-Msg-Id": msg_id},
                timeout=10.0,
            )
        except (NatsError, TimeoutError) as exc:
            why = describe_publish_failure(exc)
            self._refusals.refused("jetstream", why)
            raise FleetUnavailable(f"JetStream did not store the dead letter: {why}") from exc
        self._refusals.stored("jetstream")


class RecorderWorker:
    def __init__(
        self,
        nc: NatsClient,
        store: PgStore,
        metrics: FleetMetrics,
        *,
        partitions: Sequence[int],
        limits: RecordingLimits,
        recorder_id: str,
        batch: int,
        stream_check_s: float = DEFAULT_CHECK_EVERY_S,
        refusals: Refusals | None = None,
    ) -> None:
        self._nc = nc
        self._refusals = refusals or Refusals()
        self._js = nc.jetstream(timeout=_API_TIMEOUT_S)
        self._store = store
        self._metrics = metrics
        self._partitions = tuple(partitions)
        self._batch = batch
        self._service = RecordingService(
            store,
            JetStreamDeadLetterSink(self._js, self._refusals),
            limits=limits,
            recorder_id=recorder_id,
            on_stage=metrics.record_stages(),
        )
        self._stopping = asyncio.Event()
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._applying: set[int] = set()
        # The consumer each bound partition reads through.
        self._subs: dict[int, str] = {}
        # Consecutive failures per partition; a fetch that answers (even empty) proves health again.
        self._failures: dict[int, int] = {}
        # The failure each failing partition last logged: the same one again at its next retry (an
        # outage retried every couple of seconds) is not logged again until it changes or ends.
        self._failing: dict[int, str] = {}
        # The stream check's last failure said, and when.
        self._check_said: tuple[str, float] | None = None
        self._guard = StreamGuard(self._js, store, metrics, every_s=stream_check_s)

    @property
    def partitions(self) -> tuple[int, ...]:
        return self._partitions

    @property
    def bound_partitions(self) -> set[int]:
        """The owned partitions whose consumer is bound right now (readiness)."""
        return set(self._subs)

    @property
    def halt_reason(self) -> str | None:
        """Why nothing is being recorded (the events stream no longer matches the positions), or ``None``."""
        return self._guard.halt_reason

    @property
    def stream_checked(self) -> bool:
        """Whether the events stream was checked against the positions at least once (readiness)."""
        return self._guard.verdict is not None

    async def lag(self) -> dict[int, int]:
        """Events stored but not yet fetched, per bound partition."""
        out: dict[int, int] = {}
        for partition, consumer in list(self._subs.items()):
            try:
                out[partition] = (await self._js.consumer_info(EVENTS_STREAM, consumer)).num_pending or 0
            except Exception:  # rebinding right now; the next round reports it
                continue
        return out

    async def start(self) -> None:
        for p in self._partitions:
            self._tasks[p] = asyncio.create_task(self._run(p), name=f"recorder-p{p}")

    async def stop(self, timeout: float = 10.0) -> None:
        """Finish the batch in hand on every partition, then stop.

        A partition that is only waiting on a fetch is cancelled at once: what it may have fetched
        is not applied, and the next recorder reads it again from the committed position.
        """
        self._stopping.set()
        for p, task in self._tasks.items():
            if p not in self._applying:
                task.cancel()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks.values(), timeout=timeout)
            for task in pending:
                task.cancel()
            # Bounded too: a cancel swallowed inside a client library must not hold the shutdown. A
            # partition left running here has applied nothing uncommitted; the next recorder re-reads.
            _, stuck = await asyncio.wait(self._tasks.values(), timeout=_STOP_GRACE_S)
            if stuck:
                log.warning(
                    "stop: %d partition reader(s) did not end after cancellation; leaving them", len(stuck)
                )
        self._tasks.clear()

    async def _run(self, partition: int) -> None:
        self._failures[partition] = 0
        while not self._stopping.is_set():
            try:
                if (await self._guard.check()).halted:
                    # Re-checked at the guard's pace, so a re-baseline resumes us without a restart.
                    await self._pause(self._guard.every_s)
                    continue
                await self._consume(partition)
                self._recovered(partition)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Keep the partition alive through broker or store outages.
                if self._stopping.is_set():
                    return
                failures = self._failures[partition] = self._failures.get(partition, 0) + 1
                delay = min(_MAX_BACKOFF_S, 0.2 * 2**failures)
                code = exc.code.value if isinstance(exc, CtxError) else type(exc).__name__
                self._metrics.record_retries.labels(code=code).inc()
                if isinstance(exc, StoreUnavailable) and "sqlstate" in exc.details:
                    # PostgreSQL runs but refuses the write: a full disk, a read-only cluster.
                    self._refusals.refused("postgres", exc.message[:200])
                self._retrying(partition, exc, delay)
                await self._pause(delay)

    def _retrying(self, partition: int, exc: Exception, delay: float) -> None:
        """Log a partition's failure when it starts or changes; its repeats at each retry only at debug."""
        said = f"{type(exc).__name__}: {exc}"
        if self._failing.get(partition) == said:
            log.debug("partition %s: still %s; retrying in %.1fs", partition, said, delay)
            return
        self._failing[partition] = said
        log.warning(
            "partition %s: %s; retrying in %.1fs (logged again when it changes or ends)",
            partition,
            said,
            delay,
            # One the fleet's errors do not name was not foreseen: where it came from is worth a trace.
            exc_info=None if isinstance(exc, CtxError) else exc,
        )

    def _recovered(self, partition: int) -> None:
        """A fetch answered or a batch was applied: the next failure starts from the shortest delay,
        and is logged whatever it is."""
        failed, self._failures[partition] = self._failures[partition], 0
        if self._failing.pop(partition, None) is not None:
            log.info("partition %s: working again after %d failed attempts", partition, failed)

    async def _pause(self, delay: float) -> None:
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        except TimeoutError:
            pass

    async def _consume(self, partition: int) -> None:
        """Read from the committed position until stopped or until delivery has a gap."""
        position = await self._store.position("recorder", partition)
        self._metrics.recorder_position.labels(partition=str(partition)).set(position)
        config = ConsumerConfig(
            filter_subject=partition_filter(partition),
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if position else DeliverPolicy.ALL,
            opt_start_seq=position + 1 if position else None,
            inactive_threshold=30.0,
            mem_storage=True,
            num_replicas=1,
        )
        # Unique per binding: a rebound partition never meets the consumer it left behind.
        name = f"recorder-p{partition}-{uuid.uuid4().hex}"
        config.name = name
        bound_at = self._guard.now()
        await self._js.add_consumer(EVENTS_STREAM, config=config)
        pull = ContinuousPull(self._nc, stream=EVENTS_STREAM, consumer=name, batch=self._batch)
        try:
            await pull.start()
            # A check begun after the consumer exists proves it sits on the stream the position
            # describes (a consumer dies with its stream); only then does the partition count as bound.
            if (await self._guard.check(since=bound_at)).halted:
                return
            if await self._position_moved(partition, position):
                return  # lowered after a lost tail (by us or another recorder): start from the new one
            epoch = self._guard.epoch
            self._subs[partition] = name
            expected = 1
            # What this reader saw committed: a store found behind it lost commits.
            committed = position
            while not self._stopping.is_set():
                try:
                    msgs = await pull.next_batch(timeout=_IDLE_CHECK_S)
                except TimeoutError:
                    # Idle, and the open request still heard from: check the stream, keep the consumer.
                    if self._failures[partition]:
                        self._recovered(partition)
                    if not await self._stream_still_ours(partition, epoch):
                        return
                    continue
                contiguous, gap = _contiguous(msgs, expected)
                if contiguous:
                    self._applying.add(partition)
                    try:
                        await self._apply(partition, contiguous, committed)
                    finally:
                        self._applying.discard(partition)
                    # Recovered: the next outage starts its backoff from the shortest delay again.
                    if self._failures[partition]:
                        self._recovered(partition)
                    self._refusals.stored("postgres")
                    expected += len(contiguous)
                    committed = max(committed, contiguous[-1].metadata.sequence.stream)
                if gap:
                    log.warning(
                        "partition %s: delivery gap at consumer seq %s; rebuilding from Postgres",
                        partition,
                        expected,
                    )
                    return
                # Cached: a JetStream call at most every few seconds for the whole recorder, not per batch.
                if not await self._stream_still_ours(partition, epoch):
                    return
        finally:
            self._subs.pop(partition, None)
            await _quietly(pull.stop())
            # The server drops it after inactive_threshold anyway; this just tidies up sooner.
            await _quietly(self._js.delete_consumer(EVENTS_STREAM, name))

    async def _position_moved(self, partition: int, position: int) -> bool:
        return await self._store.position("recorder", partition) != position

    async def _stream_still_ours(self, partition: int, epoch: int) -> bool:
        """False once the guard halts or lowered positions; a failed check keeps a bound consumer."""
        try:
            return not (await self._guard.check()).halted and self._guard.epoch == epoch
        except Exception as exc:  # a broker or store blip; the fetch or the next batch reports it
            self._check_failed(partition, f"{type(exc).__name__}: {exc}")
            return True

    def _check_failed(self, partition: int, said: str) -> None:
        # The guard's check is shared by every partition, and an idle one checks each second: through an
        # outage the same failure is said when it starts or changes, then once in a while, not each time.
        now = time.monotonic()
        if self._check_said is not None and self._check_said[0] == said:
            if now - self._check_said[1] < _CHECK_FAILED_LOG_EVERY_S:
                log.debug("partition %s: events stream check failed again: %s", partition, said)
                return
        self._check_said = (said, now)
        log.warning(
            "partition %s: events stream check failed: %s (said again if it changes, or in %.0fs)",
            partition,
            said,
            _CHECK_FAILED_LOG_EVERY_S,
        )

    async def _apply(self, partition: int, msgs: Sequence[Msg], committed: int) -> None:
        batch = [Incoming(m.subject, m.data, m.metadata.sequence.stream, _msg_id(m)) for m in msgs]
        await self._record(partition, batch, committed)

    async def _record(self, partition: int, batch: list[Incoming], committed: int) -> None:
        started = time.perf_counter()
        # A PositionRegressed leaves the loop: the partition rebinds from the position the store holds.
        result = await self._service.record_batch(partition, batch, committed=committed)
        log.debug(
            "partition %s: %d fetched (seq %d..%d): %d recorded, %d duplicate, %d rejected, %d skipped",
            partition,
            len(batch),
            batch[0].stream_seq,
            batch[-1].stream_seq,
            result.recorded,
            result.duplicates,
            len(result.rejections),
            result.skipped,
        )
        self._metrics.record_batch_seconds.observe(time.perf_counter() - started)
        self._metrics.record_batch_events.observe(len(batch))
        self._metrics.recorder_position.labels(partition=str(partition)).set(batch[-1].stream_seq)
        await self._announce(result)

    async def _announce(self, result: BatchResult) -> None:
        self._metrics.events_recorded.inc(result.recorded)
        self._metrics.events_duplicate.inc(result.duplicates)
        touched = dict(result.heads)
        for rejection in result.rejections:
            self._metrics.events_rejected.labels(code=rejection.code.value).inc()
            if rejection.code is ErrorCode.UNSTORABLE_EVENT:
                self._metrics.events_unstorable.labels(stage=str(rejection.details.get("stage"))).inc()
            # The thread the body names is told too: a prepare there may be waiting on the refused key.
            for thread_id in (rejection.thread_id, rejection.named_thread):
                if thread_id and thread_id not in touched:
                    touched[thread_id] = (-1, -1)
        for thread_id, (seq, revision) in touched.items():
            # A hint for waiting prepares and the background workers of every process (this one's too):
            # they read the ledger, so a lost notice only delays.
            await self._nc.publish(
                recorded_subject(thread_id),
                json.dumps({"seq": seq, "revision": revision}).encode(),
            )


async def _quietly(step: Awaitable[object]) -> None:
    try:
        await asyncio.shield(step)
    except (Exception, asyncio.CancelledError):
        pass


def _msg_id(msg: Msg) -> str | None:
    return (msg.headers or {}).get("Nats-Msg-Id")


def _contiguous(msgs: Sequence[Msg], expected: int) -> tuple[list[Msg], bool]:
    """The messages before the first consumer-sequence gap, and whether there was one."""
    out: list[Msg] = []
    for m in msgs:
        if m.metadata.sequence.consumer != expected + len(out):
            return out, True
        out.append(m)
    return out, False
