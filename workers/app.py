"""Wiring and lifecycle of one process's workers: start, health, backlog gauges, drain and stop.

What runs is decided in :mod:`workers.compose`; all workers can run in one process (the embedded
default) or one kind per process (k8s).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import asyncpg
from faststream.exceptions import IncorrectState
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from contracts.subjects import RECORDED
from contracts.exceptions import InvalidConfiguration
from ctxfleet_client.client import connect_nats
from services.core.tokens import EncodingName, counter_for
from services.settings import Settings
from services.store.connect import create_pool
from services.store.postgres import PgStore
from services.app.final_checks import GatewayService
from services.app.preparing import PrepareService
from services.app.tracing import Tracing, start_tracing
from services.store.final_checks import PgGatewayStore
from services.store.ports import HookGrants

from .backlogs import export_backlogs, watch_backlogs
from .responder import Responder
from .budgeter import BudgeterWorker
from .compose import compose
from .console import console_app
from .health import HealthServer
from .indexer import IndexerWorker
from .metrics import FleetMetrics
from .recorder import RecorderWorker
from .refusals import Refusals

__all__ = ["Fleet", "encodings_at_start"]

log = logging.getLogger("ctxfleet")
_STARTUP_RETRY_S = 2.0
_POOL_CLOSE_S = 5.0
_GAUGES_STOP_S = 2.0


# Subjects whose messages only say "look again"; dropping buffered ones on shutdown loses nothing.
_HINT_SUBJECTS = (f"{RECORDED}.", "ctx.compacted.")


async def _answer_what_was_delivered(broker: NatsBroker, responder: Responder | None = None) -> None:
    """Drain every core subscription: requests already delivered here are answered, then it unsubscribes.

    ``responder``'s request/reply subscriptions are drained alike, and every request they took is
    answered before this returns.

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
        except NatsError as exc:
            log.debug("drain: %s", exc)
        setattr(subscriber, "subscription", None)  # noqa: B010  # typed as object: nothing left to unsubscribe

    await asyncio.gather(
        *(drain(s) for s in broker.subscribers), *([responder.drain()] if responder is not None else [])
    )


@dataclass
class Fleet:
    settings: Settings
    nats_urls: tuple[str, ...]  # one server, or a cluster's
    database_url: str
    metrics: FleetMetrics = field(default_factory=FleetMetrics)
    pool: asyncpg.Pool | None = None
    broker: NatsBroker | None = None
    recorder: RecorderWorker | None = None
    budgeter: BudgeterWorker | None = None
    indexer: IndexerWorker | None = None
    # Where the gateway's final check reads hook grants: the registered hook sets unless this is set.
    hook_grants: HookGrants | None = None
    gateway: GatewayService | None = None
    # What the console shows contexts with: the assembler's own prepares (workers/compose.py).
    showing: PrepareService | None = None
    http_port: int | None = None
    # What JetStream and PostgreSQL refused this process's writes lately (readiness says it).
    refusals: Refusals = field(default_factory=Refusals)
    # Further readiness checks by name, from whoever runs the servers (``ctxfleet up``: its
    # embedded JetStream's store); each answers ``None`` when fine, or why it is not.
    extra_checks: dict[str, Callable[[], str | None]] = field(default_factory=dict)
    _nc: NatsClient | None = None
    _gauges: asyncio.Task[None] | None = None
    _http: HealthServer | None = None
    _started: bool = False
    _draining: bool = False
    _waiting: str | None = None
    # Answers the request/reply endpoints of this process (workers/responder.py).
    responder: Responder | None = None
    # Spans of prepares, compactions, rollovers and hook calls; from ``CTX_TRACES`` unless given.
    tracing: Tracing | None = None
    _own_tracing: Tracing | None = None

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
        names = s.process.worker_names
        if s.process.http_port:
            # First, so a probe can tell "starting" (503) from "dead" while connections come up.
            await self._serve_operations(s.process.http_host, s.process.http_port)
        if prerequisites is not None:
            await self._wait_for(prerequisites, retry_on)
        self.pool = await create_pool(
            self.database_url, min_size=2, max_size=s.store.db_pool_size, **s.store.database_options()
        )
        self._nc = await connect_nats(
            self.nats_urls, name=f"ctxfleet-{s.process.recorder_id}", **s.bus.nats_options()
        )
        if self.tracing is None:
            self.tracing = self._own_tracing = start_tracing(s.process.traces)
        workers = compose(
            s,
            self.nats_urls,
            PgStore(self.pool),
            self._nc,
            self.metrics,
            gateway_store=PgGatewayStore(self.pool),
            hook_grants=self.hook_grants,
            refusals=self.refusals,
            tracing=self.tracing,
        )
        self.broker, self.budgeter, self.indexer = workers.broker, workers.budgeter, workers.indexer
        self.gateway, self.responder, self.showing = workers.gateway, workers.responder, workers.showing
        await self.broker.start()
        if self.responder is not None:
            await self.responder.start()  # the request/reply endpoints, on the broker's connection
        if self.budgeter is not None:
            await self.budgeter.start()
        if self.indexer is not None:
            await self.indexer.start()
        if workers.recorder is not None:
            self.recorder = workers.recorder
            await self.recorder.start()
        self._gauges = asyncio.create_task(watch_backlogs(self.export_backlogs, lambda: self._draining))
        self._started = True
        for encoding in encodings_at_start(names):
            counter_for(encoding)
        _freeze_start_up_heap()
        self.metrics.gc_pauses.install()
        log.info("workers %s started", ", ".join(names))

    async def _serve_operations(self, host: str, port: int) -> None:
        # The console reads through this process's pool, once there is one (``None``: a "starting" page).
        console = console_app(
            lambda: None if self.pool is None else PgStore(self.pool),
            lambda: self.showing,
            remote=self.settings.process.console_remote,
        )
        self._http = HealthServer(self.metrics.registry, self.readiness, self.liveness, console)
        try:
            self.http_port = await self._http.start(host, port)
        except OSError as exc:
            self._http = None
            raise InvalidConfiguration(
                [f"CTX_HTTP_PORT: cannot listen on {host}:{port}: {exc.strerror or exc}"]
            ) from None

    async def _wait_for(
        self, prerequisites: Callable[[], Awaitable[None]], retry_on: tuple[type[BaseException], ...]
    ) -> None:
        deadline = time.monotonic() + self.settings.process.startup_wait_s
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
        checks["postgres"] = await self._check_postgres() or self.refusals.why("postgres")
        # A full disk shows only when a write is refused: this process's own, or the embedded store's.
        checks["jetstream"] = self.refusals.why("jetstream")
        for name, check in self.extra_checks.items():
            checks[name] = checks.get(name) or check()
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
            read_only = await asyncio.wait_for(PgStore(pool).read_only(), timeout=2.0)
        except Exception as exc:  # whatever the driver raises, the answer is "not ready, because"
            return f"{type(exc).__name__}: {exc}"[:200]
        # A standby, or default_transaction_read_only: every event would wait, unrecorded.
        return "read-only (transaction_read_only is on): nothing can be recorded" if read_only else None

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
        """Set the compaction queue gauges and ``ctx_consumer_lag_*`` for the workers of this process."""
        if self._nc is None:
            return
        await export_backlogs(
            self._nc,
            self.settings.process.worker_names,
            self.metrics,
            self.recorder,
            self.budgeter,
            self.indexer,
        )

    async def stop(self) -> None:
        """Stop pulling, finish and ack what is in hand, close connections. Safe to call twice.

        Readiness turns 503 first, so a load balancer stops routing prepares here while we drain.
        """
        self._draining = True
        self.metrics.gc_pauses.uninstall()
        recorder, budgeter, nc, broker, pool = self.recorder, self.budgeter, self._nc, self.broker, self.pool
        self.recorder = self.budgeter = self._nc = self.broker = self.pool = None
        self.showing = None
        if self._gauges is not None:
            self._gauges.cancel()
            # Bounded: see watch_backlogs; it ends on the flag within one round if the cancel is lost.
            await asyncio.wait({self._gauges}, timeout=_GAUGES_STOP_S)
            self._gauges = None
        started = time.perf_counter()
        if recorder is not None:
            await recorder.stop(timeout=self.settings.process.shutdown_timeout_s)
            log.info("shutdown: recorder stopped after %.2fs", time.perf_counter() - started)
        if broker is not None:
            try:
                await asyncio.wait_for(
                    _answer_what_was_delivered(broker, self.responder),
                    timeout=self.settings.process.shutdown_timeout_s,
                )
            except TimeoutError:
                log.warning(
                    "shutdown: requests still being answered after %.1fs; stopping anyway",
                    self.settings.process.shutdown_timeout_s,
                )
            log.info("shutdown: subscriptions drained after %.2fs", time.perf_counter() - started)
            try:
                await broker.stop()
            except NatsError as exc:  # NATS is down or reconnecting: there is nothing left to drain
                log.warning("shutdown: broker: %s", type(exc).__name__)
            log.info(
                "shutdown: requests answered and jobs finished after %.2fs", time.perf_counter() - started
            )
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            # No prepare is answered any more: store the records still pending while the pool is open.
            await gateway.close(self.settings.process.shutdown_timeout_s)
            log.info("shutdown: gateway records written after %.2fs", time.perf_counter() - started)
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
                log.warning(
                    "shutdown: database pool not closed after %.0fs; terminating its connections",
                    _POOL_CLOSE_S,
                )
                pool.terminate()
                closing.cancel()
        own_tracing, self._own_tracing = self._own_tracing, None
        if own_tracing is not None:
            self.tracing = None
            # The batch exporter's last flush is a blocking HTTP post: off the loop.
            await asyncio.to_thread(own_tracing.shutdown)
        if self._http is not None:
            await self._http.close()
            self._http = None


def _freeze_start_up_heap() -> None:
    """Move what start-up allocated (modules, classes, schemas: ~100k objects that live as long as the
    process) out of the collector's generations, once per process.

    The collector stays on for everything requests allocate. Left in its oldest generation, those
    objects were walked again by every full collection: 100+ ms with the event loop stopped, the tail
    of the 50-agent steps (docs/measurements.md).
    """
    if gc.get_freeze_count():
        return  # a second fleet in this process (tests) finds it done
    gc.collect()
    gc.freeze()


def encodings_at_start(names: Sequence[str]) -> tuple[EncodingName, ...]:
    """The tokenizers a process of workers ``names`` loads before it serves.

    o200k: every record is counted with it. cl100k only with a compactor, which counts every summary
    in both encodings: loaded at its first compaction instead, it stalled the event loop for ~140 ms.
    Elsewhere it is loaded on a reader's first need.
    """
    return ("o200k_base", "cl100k_base") if "compactor" in names else ("o200k_base",)
