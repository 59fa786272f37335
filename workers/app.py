"""Composition: the workers of one process, wired to one pool, one broker and one registry.

All workers can run in one process (the embedded default) or one kind per process (k8s).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from dataclasses import dataclass, field

import asyncpg
from faststream import FastStream
from faststream.exceptions import IncorrectState
from faststream.nats import NatsBroker
from faststream.nats.security import NatsCredentials, NatsNKey, NatsSecurity, NatsToken, NatsUserPassword
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.js.errors import NotFoundError
from nats.errors import Error as NatsError

from contracts import JOBS_STREAM, DeadLetter
from contracts.subjects import DEAD, RECORDED
from services.budgeting import BudgetService
from services.errors import InvalidConfiguration
from services.client import connect_nats
from services.compacting import CompactionService, SummarizerFactory
from services.compaction.http_summarizer import HttpSummarizer, HttpSummarizerConfig
from services.compaction.model import Summarizer
from services.compaction.structured import StructuredSummarizer
from services.ledger import RecordingLimits
from services.notices import NoticeBoard
from services.preparing import PrepareService
from services.records import LedgerRecord
from services.settings import Settings
from services.store.connect import create_pool
from services.store.postgres import PgStore
from services.views import ViewLoader

from .admission import RequestLimits
from .assembler import AssemblerWorker
from .budgeter import BudgeterWorker
from .compactor import COMPACTOR_DURABLE, CompactorWorker
from .health import HealthServer
from .indexer import IndexerWorker
from .jobs import CountedJobQueue, JetStreamJobQueue
from .metrics import FleetMetrics
from .recorder import RecorderWorker

__all__ = ["Fleet", "broker_security", "create_docs_app", "recording_limits", "summarizer_factory"]

log = logging.getLogger("ctxfleet")
_STARTUP_RETRY_S = 2.0
_POOL_CLOSE_S = 5.0
_GAUGES_STOP_S = 2.0


def recording_limits(settings: Settings) -> RecordingLimits:
    """The recorder limits a settings object describes."""
    return RecordingLimits(
        max_event_bytes=settings.max_event_bytes,
        blob_min_bytes=settings.blob_min_bytes,
        tool_result_max_tokens=settings.tool_result_max_tokens,
    )


def summarizer_factory(settings: Settings) -> SummarizerFactory:
    """The configured summarizer (deterministic by default)."""
    if settings.summarizer == "openai":
        assert settings.summarizer_base_url and settings.summarizer_model
        config = HttpSummarizerConfig(
            base_url=settings.summarizer_base_url,
            model=settings.summarizer_model,
            api_key=settings.summarizer_api_key.get_secret_value() if settings.summarizer_api_key else None,
            api=settings.summarizer_api,
        )

        def http(current_request: LedgerRecord | None) -> Summarizer:
            return HttpSummarizer(config)

        return http

    def structured(current_request: LedgerRecord | None) -> Summarizer:
        return StructuredSummarizer(current_request)

    return structured


def _document_outputs(broker: NatsBroker) -> None:
    # Declared so the AsyncAPI document lists what the recorder publishes.
    broker.publisher(
        f"{DEAD}.events.{{thread}}",
        title="dead letters",
        description="Rejected events with reason and raw payload (stream CTX_DEAD).",
        schema=DeadLetter,
    )


def create_docs_app() -> FastStream:
    """The FastStream app as AsyncAPI sees it (nothing connects)."""
    broker = NatsBroker("nats://localhost:4222")
    metrics = FleetMetrics()
    broker.include_router(AssemblerWorker(None, NoticeBoard(), metrics).router)
    broker.include_router(BudgeterWorker(None, None, metrics).router)
    broker.include_router(CompactorWorker(None, metrics).router)
    broker.include_router(IndexerWorker(None, metrics).router)
    _document_outputs(broker)
    return FastStream(broker)


def _parse_nats_time(value: str) -> datetime | None:
    # NATS sends RFC 3339 with nanoseconds; Python parses at most microseconds.
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?", value)
    if match is None:
        return None
    fraction = (match.group(2) or ".0")[:7]
    return datetime.fromisoformat(match.group(1) + fraction).replace(tzinfo=UTC)


async def _watch_backlogs(fleet: Fleet, every_s: float = 5.0) -> None:
    """Export what operators scale and alert on: the compaction queue and each worker's lag."""
    # Ends on the flag, not only on cancellation: a cancel that lands in a client library's own
    # wait_for can be swallowed (Python 3.11), and this loop would then run on for ever.
    while not fleet.draining:
        try:
            await fleet.export_backlogs()
        except Exception as exc:  # a metrics loop must never take the worker down
            log.debug("backlog metrics: %s", exc)
        await asyncio.sleep(every_s)


# Subjects whose messages only say "look again"; dropping buffered ones on shutdown loses nothing.
_HINT_SUBJECTS = (f"{RECORDED}.", "ctx.compacted.")


async def _answer_what_was_delivered(broker: NatsBroker) -> None:
    """Drain every core subscription: requests already delivered here are answered, then it unsubscribes.

    FastStream's stop unsubscribes outright, which drops requests buffered in this process (their
    callers would time out although another assembler could have served them). A drain tells the
    server to stop sending, then handles what was delivered; new requests go to the other replicas.
    """

    async def drain(subscriber: object) -> None:
        subscription = getattr(subscriber, "subscription", None)
        if not isinstance(subscription, Subscription):  # JetStream pull subscriptions ack or redeliver
            return
        try:
            if subscription.subject.startswith(_HINT_SUBJECTS):
                # Notices are hints (the sweep and Postgres are the truth): a burst leaves thousands
                # buffered, and handling them all would hold the shutdown past its bound for nothing.
                await subscription.unsubscribe()
            else:
                await subscription.drain()  # type: ignore[no-untyped-call]
                await _handled(subscriber)
        except NatsError as exc:
            log.debug("drain: %s", exc)
        setattr(subscriber, "subscription", None)  # noqa: B010  # typed as object: nothing left to unsubscribe

    await asyncio.gather(*(drain(s) for s in broker.subscribers))


async def _handled(subscriber: object, poll_s: float = 0.01) -> None:
    """Until a concurrent subscriber has answered everything it took (the caller bounds the wait).

    A drained subscription only says its messages reached the callback; a ``max_workers``
    subscriber's callback merely queues them in memory for its workers, and stopping the broker
    cancels those — requests that were delivered here and never answered. Idle means: every worker
    slot free and nothing queued.
    """
    limiter, workers, queued = (getattr(subscriber, name, None) for name in ("limiter", "max_workers", "receive_stream"))
    if limiter is None or not isinstance(workers, int):
        return
    # Polled: FastStream's workers signal nothing when they go idle.
    while limiter.value < workers or (queued is not None and queued.statistics().current_buffer_used > 0):  # noqa: ASYNC110
        await asyncio.sleep(poll_s)


def broker_security(settings: Settings) -> NatsSecurity | None:
    """The FastStream form of the NATS credentials and TLS that ``settings`` configure."""
    options = settings.nats_options()
    tls = options.get("tls")
    if "user" in options:
        return NatsUserPassword(options["user"], options["password"], ssl_context=tls)
    if "token" in options:
        return NatsToken(options["token"], ssl_context=tls)
    if "nkeys_seed" in options:
        return NatsNKey(options["nkeys_seed"], ssl_context=tls)
    if "user_credentials" in options:
        return NatsCredentials(options["user_credentials"], ssl_context=tls)
    if tls is not None:
        return NatsSecurity(ssl_context=tls)
    return None


@dataclass
class Fleet:
    """The running workers of this process."""

    settings: Settings
    nats_url: str
    database_url: str
    metrics: FleetMetrics = field(default_factory=FleetMetrics)
    pool: asyncpg.Pool | None = None
    broker: NatsBroker | None = None
    recorder: RecorderWorker | None = None
    budgeter: BudgeterWorker | None = None
    indexer: IndexerWorker | None = None
    http_port: int | None = None
    _nc: NatsClient | None = None
    _gauges: asyncio.Task[None] | None = None
    _http: HealthServer | None = None
    _started: bool = False
    _draining: bool = False
    _waiting: str | None = None

    async def start(
        self,
        prerequisites: Callable[[], Awaitable[None]] | None = None,
        retry_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        """Serve the operations endpoint, wait for ``prerequisites``, connect and start every worker.

        ``prerequisites`` failing with one of ``retry_on`` is retried for ``CTX_STARTUP_WAIT_S``
        (live, not ready, the reason on /readyz); then, or with any other error, start fails.
        """
        s = self.settings
        names = s.worker_names
        if s.http_port:
            # First, so a probe can tell "starting" (503) from "dead" while connections come up.
            await self._serve_operations(s.http_host, s.http_port)
        if prerequisites is not None:
            await self._wait_for(prerequisites, retry_on)
        self.pool = await create_pool(
            self.database_url, min_size=2, max_size=s.db_pool_size, **s.database_options()
        )
        self._nc = await connect_nats(self.nats_url, name=f"ctxfleet-{s.recorder_id}", **s.nats_options())
        queue = JetStreamJobQueue(self._nc.jetstream(timeout=10.0))
        store = PgStore(self.pool)
        loader = ViewLoader()
        self.broker = NatsBroker(
            self.nats_url,
            name=f"ctxfleet-broker-{s.recorder_id}",
            logger=None,
            security=broker_security(s),
            # Like our own connection: ride out any broker outage rather than give up after a minute.
            max_reconnect_attempts=-1,
            # nats-py's default 2 s between attempts was nearly all of a restart's recovery time.
            reconnect_time_wait=0.5,  # type: ignore[arg-type]
            # On SIGTERM a handler in progress (a compaction) may finish and ack within the bound.
            graceful_timeout=s.shutdown_timeout_s,
        )
        if "assembler" in names:
            board = NoticeBoard()
            counted = CountedJobQueue(queue, self.metrics)
            service = PrepareService(store, board, loader=loader, queue=counted, compaction_wait_ms=s.compaction_wait_ms)
            limits = RequestLimits(max_inflight=s.max_inflight_requests, max_queue_age_ms=s.max_queue_age_ms)
            self.broker.include_router(AssemblerWorker(service, board, self.metrics, self.pool, limits=limits).router)
        if "budgeter" in names:
            self.budgeter = BudgeterWorker(BudgetService(store, ViewLoader(), queue), self.pool, self.metrics)
            self.broker.include_router(self.budgeter.router)
        if "indexer" in names:
            self.indexer = IndexerWorker(self.pool, self.metrics)
            self.broker.include_router(self.indexer.router)
        if "compactor" in names:
            nc = self._nc

            async def notify(subject: str, body: bytes) -> None:
                await nc.publish(subject, body)

            compaction = CompactionService(store, ViewLoader(), summarizer_factory(s))
            self.broker.include_router(CompactorWorker(compaction, self.metrics, notify).router)
        await self.broker.start()
        if self.budgeter is not None:
            await self.budgeter.start()
        if self.indexer is not None:
            await self.indexer.start()
        if "recorder" in names:
            self.recorder = RecorderWorker(
                self._nc,
                self.pool,
                self.metrics,
                partitions=s.owned_partitions(),
                limits=recording_limits(s),
                recorder_id=s.recorder_id,
                batch=s.record_batch,
            )
            await self.recorder.start()
        self._gauges = asyncio.create_task(_watch_backlogs(self))
        self._started = True
        log.info("workers %s started", ", ".join(names))

    async def _serve_operations(self, host: str, port: int) -> None:
        self._http = HealthServer(self.metrics.registry, self.readiness, self.liveness)
        try:
            self.http_port = await self._http.start(host, port)
        except OSError as exc:
            self._http = None
            raise InvalidConfiguration([f"CTX_HTTP_PORT: cannot listen on {host}:{port}: {exc.strerror or exc}"]) from None

    async def _wait_for(self, prerequisites: Callable[[], Awaitable[None]], retry_on: tuple[type[BaseException], ...]) -> None:
        deadline = time.monotonic() + self.settings.startup_wait_s
        while True:
            try:
                await prerequisites()
                self._waiting = None
                return
            except retry_on as exc:
                if time.monotonic() >= deadline:
                    raise
                if self._waiting != str(exc):
                    log.warning("startup: waiting: %s", exc)
                self._waiting = str(exc)
                await asyncio.sleep(_STARTUP_RETRY_S)

    @property
    def draining(self) -> bool:
        """Whether ``stop`` has begun."""
        return self._draining

    async def liveness(self) -> dict[str, str | None]:
        """Whether a restart would help: only when the NATS connection is gone for good."""
        closed = self._nc is not None and self._nc.is_closed and not self._draining
        return {"nats": "connection closed" if closed else None}

    async def readiness(self) -> dict[str, str | None]:
        """Each dependency of serving, ``None`` when fine: NATS, Postgres, bound consumers."""
        checks: dict[str, str | None] = {}
        if self._draining:
            checks["shutdown"] = "draining"
        if self._waiting is not None:
            checks["startup"] = f"waiting: {self._waiting}"[:300]
        checks["nats"] = None if self._nc is not None and self._nc.is_connected else "not connected"
        nats_down = self._nats_down()
        if self.broker is None:
            checks["broker"] = "not started"
        else:
            checks["broker"] = None if await self.broker.ping(timeout=1.0) else "not connected"
        checks["postgres"] = await self._check_postgres()
        # Consumers bound before an outage receive nothing during it: not "ok" while NATS is down.
        checks["consumers"] = f"NATS {nats_down}" if nats_down is not None else self._check_consumers()
        return checks

    def _nats_down(self) -> str | None:
        """Why this process cannot reach NATS (our connection or the broker's), ``None`` when it can."""
        nc = self._nc
        if nc is None:
            return "not connected"
        if not nc.is_connected:
            return "reconnecting" if nc.is_reconnecting else "not connected"
        if self.broker is None:
            return None
        try:
            broker_nc = self.broker.connection
        except IncorrectState:
            return "broker not connected"
        if not broker_nc.is_connected:
            return "broker reconnecting" if broker_nc.is_reconnecting else "broker not connected"
        return None

    async def _check_postgres(self) -> str | None:
        pool = self.pool
        if pool is None:
            return "not connected"
        try:
            await asyncio.wait_for(pool.fetchval("SELECT 1"), timeout=2.0)
        except Exception as exc:  # whatever the driver raises, the answer is "not ready, because"
            return f"{type(exc).__name__}: {exc}"[:200]
        return None

    def _check_consumers(self) -> str | None:
        if not self._started:
            return "starting"
        if self.recorder is not None:
            # A halted recorder unbinds every partition: its one reason says why, not the unbinding.
            halted = self._check_recorder(self.recorder)
            if halted is not None:
                return halted
            unbound = sorted(set(self.recorder.partitions) - self.recorder.bound_partitions)
            if unbound:
                return f"recorder partitions not bound: {unbound}"
        return None

    @staticmethod
    def _check_recorder(recorder: RecorderWorker) -> str | None:
        # Bound consumers are not enough: positions ahead of a re-created stream bind fine and read nothing.
        if recorder.halt_reason is not None:
            return recorder.halt_reason
        if not recorder.stream_checked:
            return "events stream not yet checked against the committed positions"
        return None

    async def export_backlogs(self) -> None:
        """Set the compaction queue gauges and ``ctx_consumer_lag`` for the workers of this process."""
        nc, names, lag = self._nc, self.settings.worker_names, self.metrics.consumer_lag
        if nc is None:
            return
        js = nc.jetstream(timeout=5.0)
        if "compactor" in names or "budgeter" in names:
            info = await js.stream_info(JOBS_STREAM)
            self.metrics.queue_depth.set(info.state.messages)
            age = 0.0
            if info.state.messages:
                try:
                    first = await js.get_msg(JOBS_STREAM, info.state.first_seq)
                except NotFoundError:
                    first = None  # a compactor acked it between the two calls: the queue moved on
                stamp = first.time if first is not None else None
                if isinstance(stamp, str):
                    stamp = _parse_nats_time(stamp)
                if isinstance(stamp, datetime):
                    age = (datetime.now(UTC) - stamp).total_seconds()
            self.metrics.queue_oldest_age.set(max(0.0, age))
        if "compactor" in names:
            consumer = await js.consumer_info(JOBS_STREAM, COMPACTOR_DURABLE)
            lag.labels(worker="compactor", consumer=COMPACTOR_DURABLE).set(consumer.num_pending + consumer.num_ack_pending)
        if self.recorder is not None:
            for partition, pending in (await self.recorder.lag()).items():
                lag.labels(worker="recorder", consumer=f"p{partition}").set(pending)
        if self.budgeter is not None:
            lag.labels(worker="budgeter", consumer="threads").set(self.budgeter.backlog)
        if self.indexer is not None:
            lag.labels(worker="indexer", consumer="threads").set(self.indexer.backlog)

    async def stop(self) -> None:
        """Stop pulling, finish and ack what is in hand, close connections. Safe to call twice.

        Readiness turns 503 first, so a load balancer stops routing prepares here while we drain.
        """
        self._draining = True
        recorder, budgeter, nc, broker, pool = self.recorder, self.budgeter, self._nc, self.broker, self.pool
        self.recorder = self.budgeter = self._nc = self.broker = self.pool = None
        if self._gauges is not None:
            self._gauges.cancel()
            # Bounded: see _watch_backlogs; it ends on the flag within one round if the cancel is lost.
            await asyncio.wait({self._gauges}, timeout=_GAUGES_STOP_S)
            self._gauges = None
        started = time.perf_counter()
        if recorder is not None:
            await recorder.stop(timeout=self.settings.shutdown_timeout_s)
            log.info("shutdown: recorder stopped after %.2fs", time.perf_counter() - started)
        if broker is not None:
            try:
                await asyncio.wait_for(_answer_what_was_delivered(broker), timeout=self.settings.shutdown_timeout_s)
            except TimeoutError:
                log.warning("shutdown: requests still being answered after %.1fs; stopping anyway", self.settings.shutdown_timeout_s)
            log.info("shutdown: subscriptions drained after %.2fs", time.perf_counter() - started)
            try:
                await broker.stop()
            except NatsError as exc:  # NATS is down or reconnecting: there is nothing left to drain
                log.warning("shutdown: broker: %s", type(exc).__name__)
            log.info("shutdown: requests answered and jobs finished after %.2fs", time.perf_counter() - started)
        if budgeter is not None:
            await budgeter.stop()
        indexer, self.indexer = self.indexer, None
        if indexer is not None:
            await indexer.stop()
        log.info("shutdown: budgeter and indexer stopped after %.2fs", time.perf_counter() - started)
        if nc is not None and not nc.is_closed:
            try:
                await nc.drain()
            except NatsError as exc:  # reconnecting: unacked work is redelivered, so just close
                log.warning("shutdown: NATS: %s; closing", type(exc).__name__)
                await nc.close()
        if pool is not None:
            # close() waits for every connection to be released, and asyncpg 0.32's floor-keeping task can
            # swallow its cancellation (seen here: a close that never returned). Not wait_for, which
            # would wait for the cancelled close too: past the bound, terminate and move on.
            closing = asyncio.ensure_future(pool.close())
            done, _ = await asyncio.wait({closing}, timeout=_POOL_CLOSE_S)
            if not done:
                log.warning("shutdown: database pool not closed after %.0fs; terminating its connections", _POOL_CLOSE_S)
                pool.terminate()
                closing.cancel()
        if self._http is not None:
            await self._http.close()
            self._http = None
