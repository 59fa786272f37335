"""Composition: which workers this process runs, built from settings around one store and one connection.

Nothing here connects or starts anything: :func:`compose` only builds; ``workers.app.Fleet`` starts,
checks and stops what it built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker
from faststream.nats.security import NatsCredentials, NatsNKey, NatsSecurity, NatsToken, NatsUserPassword
from nats.aio.client import Client as NatsClient

from services.app.budgeting import BudgetService
from services.app.compacting import CompactionService, SummarizerFactory
from services.app.manual_compaction import ManualCompaction
from ctxfleet_client.client import log_nats_error
from services.edge.http_summarizer import HttpSummarizer, HttpSummarizerConfig
from services.core.compaction.structured import StructuredSummarizer
from services.core.ledger import RecordingLimits
from services.app.notices import NoticeBoard
from services.app.final_checks import GatewayService
from services.app.hook_registry import HookRegistry
from services.app.tracing import Tracing
from services.app.preparing import PrepareService
from workers.hook_runner import HookMetrics, NatsHookRunner
from services.settings import Settings, nats_connection
from services.store.postgres import PgStore
from services.store.ports import GatewayStore, HookGrants
from services.app.view_cache import ViewCache
from services.app.views import ViewLoader

from .admission import RequestLimits
from .assembler import AssemblerWorker
from .budgeter import BudgeterWorker
from .compactor import CompactorWorker
from .prepares_first import PreparesFirst
from .responder import Responder
from .indexer import IndexerWorker
from .jobs import CountedJobQueue, JetStreamJobQueue
from .manual import manual_router
from .metrics import FleetMetrics
from .recorder import RecorderWorker
from .refusals import Refusals
from .replies import ReplyRule

__all__ = [
    "Workers",
    "broker_security",
    "compose",
    "create_broker",
    "create_docs_app",
    "recording_limits",
    "reply_rule",
    "summarizer_factory",
]


def reply_rule(settings: Settings, nats_urls: tuple[str, ...]) -> ReplyRule:
    """Where this process's answers may go: connecting with a user name (``CTX_NATS_USER`` or a URL's),
    the bus names its users (the grants of ``contracts/identities.py``), so only the requester's own
    inbox is answered."""
    _, options = nats_connection(nats_urls, settings.bus.nats_options())
    return ReplyRule(named_users=bool(options.get("user")))


def recording_limits(settings: Settings) -> RecordingLimits:
    return RecordingLimits(
        max_event_bytes=settings.limits.max_event_bytes,
        tool_result_max_tokens=settings.limits.tool_result_max_tokens,
        user_input_max_tokens=settings.limits.user_input_max_tokens,
    )


def summarizer_factory(settings: Settings) -> SummarizerFactory:
    chosen = settings.compaction
    if chosen.summarizer == "openai":
        assert chosen.summarizer_base_url and chosen.summarizer_model
        config = HttpSummarizerConfig(
            base_url=chosen.summarizer_base_url,
            model=chosen.summarizer_model,
            api_key=chosen.summarizer_api_key.get_secret_value() if chosen.summarizer_api_key else None,
            api=chosen.summarizer_api,
        )
        return lambda current_request: HttpSummarizer(config)
    return StructuredSummarizer


def broker_security(options: dict[str, Any]) -> NatsSecurity | None:
    """The FastStream form of NATS credentials and TLS given as ``nats.connect`` options."""
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


def create_broker(settings: Settings, nats_urls: tuple[str, ...]) -> NatsBroker:
    """The FastStream broker of this process on ``nats_urls`` (a server or a cluster), not yet connected."""
    servers, options = nats_connection(nats_urls, settings.bus.nats_options())
    return NatsBroker(
        servers,
        name=f"ctxfleet-broker-{settings.process.recorder_id}",
        logger=None,
        security=broker_security(options),
        # Like our own connection: ride out any broker outage rather than give up after a minute.
        max_reconnect_attempts=-1,
        # nats-py's default 2 s between attempts was nearly all of a restart's recovery time.
        reconnect_time_wait=0.5,  # type: ignore[arg-type]
        # On SIGTERM a handler in progress (a compaction) may finish and ack within the bound.
        graceful_timeout=settings.process.shutdown_timeout_s,
        error_cb=log_nats_error,
    )


@dataclass(frozen=True, slots=True)
class Workers:
    """What one process runs: the broker carrying its subscribers, and the workers with their own loops."""

    broker: NatsBroker
    loader: ViewLoader
    budgeter: BudgeterWorker | None
    indexer: IndexerWorker | None
    recorder: RecorderWorker | None
    gateway: GatewayService | None = None
    # Answers the request/reply endpoints; the shutdown waits for what it has in hand.
    responder: Responder | None = None
    # What shows a thread's context (the console): the assembler's, so that it calls the same prepare
    # hooks and counts with the same calibration as ``ctxfleet context``.
    showing: PrepareService | None = None


def compose(
    settings: Settings,
    nats_urls: tuple[str, ...],
    store: PgStore,
    nc: NatsClient,
    metrics: FleetMetrics,
    *,
    gateway_store: GatewayStore | None = None,
    hook_grants: HookGrants | None = None,
    refusals: Refusals | None = None,
    tracing: Tracing | None = None,
) -> Workers:
    """The workers ``settings`` name, wired to ``store``, ``nc`` and one broker; nothing is started.

    The gateway's final check runs beside the assembler when given its store; it reads hook grants
    from the registered hook sets, or from ``hook_grants`` when given (a twin in tests). The writers
    report what JetStream and PostgreSQL refuse to ``refusals`` (readiness reads it). The assembler,
    the compactions and the hook calls record their spans with ``tracing`` (none when not given).
    """
    tracing = tracing or Tracing.off()
    gateway: GatewayService | None = None
    names = settings.process.worker_names
    refusals = refusals or Refusals()
    queue = JetStreamJobQueue(nc.jetstream(timeout=10.0), refusals)
    # One loader per process: the assembler, budgeter and compactor of a process read the same hot
    # threads, and three caches would hold (and re-read) the same records three times.
    loader = ViewLoader(cache=ViewCache(settings.tuning.view_cache_mb * 1024 * 1024))
    metrics.watch_view_cache(loader.cache)
    broker = create_broker(settings, nats_urls)
    hooks = HookRegistry(
        store,
        NatsHookRunner(nc, tracing),
        HookMetrics(metrics.hook_calls, metrics.hook_seconds),
        tracing,
    )
    limits = RequestLimits(
        max_inflight=settings.limits.max_inflight_requests, max_queue_age_ms=settings.limits.max_queue_age_ms
    )
    # Every request/reply endpoint of this process (the assembler's, the compactor's), answered on the
    # connection the requests come in on (the broker's, once started), and only to the requester's inbox.
    responder = Responder(
        lambda: broker.connection,
        limits.max_tasks,
        replies=reply_rule(settings, nats_urls),
        refused=metrics.replies_refused,
    )
    # A process without an assembler shows contexts as one would: its loader, its hooks, no queue.
    showing = PrepareService(store, NoticeBoard(), loader=loader, compaction_wait_ms=0, hooks=hooks)
    # The prepares in progress in this process, which its budgeter's and indexer's passes wait for.
    prepares = PreparesFirst()
    if "assembler" in names:
        board = NoticeBoard()
        counted = CountedJobQueue(queue, metrics)
        showing = service = PrepareService(
            store,
            board,
            loader=loader,
            queue=counted,
            compaction_wait_ms=settings.limits.compaction_wait_ms,
            hooks=hooks,
            on_stage=metrics.prepare_stages(),
        )
        if gateway_store is not None:
            gateway = GatewayService(
                gateway_store,
                hook_grants or hooks,
                store,
                max_pending_records=settings.limits.gateway_pending_records,
                max_pending_bytes=settings.limits.gateway_pending_mb * 1024 * 1024,
                before_derive=prepares.before_pass,
            )
            metrics.watch_gateway(gateway)
            service.gateway = gateway
        assembler = AssemblerWorker(
            service,
            board,
            metrics,
            store,
            limits=limits,
            gateway=gateway,
            responder=responder,
            tracing=tracing,
            prepares=prepares,
        )
        broker.include_router(assembler.router)
    budgeter = None
    if "budgeter" in names:
        budgeter = BudgeterWorker(BudgetService(store, loader, queue), store, metrics, prepares=prepares)
        broker.include_router(budgeter.router)
    indexer = None
    if "indexer" in names:
        indexer = IndexerWorker(store, metrics, prepares=prepares)
        broker.include_router(indexer.router)
    if "compactor" in names:

        async def notify(subject: str, body: bytes) -> None:
            await nc.publish(subject, body)

        compaction = CompactionService(
            store, loader, summarizer_factory(settings), hooks=hooks, tracing=tracing
        )
        broker.include_router(CompactorWorker(compaction, metrics, notify).router)
        broker.include_router(
            manual_router(ManualCompaction(store, loader, compaction), responder, notify, metrics)
        )
    recorder = None
    if "recorder" in names:
        recorder = RecorderWorker(
            nc,
            store,
            metrics,
            partitions=settings.owned_partitions(),
            limits=recording_limits(settings),
            recorder_id=settings.process.recorder_id,
            batch=settings.tuning.record_batch,
            refusals=refusals,
        )
    return Workers(broker, loader, budgeter, indexer, recorder, gateway, responder, showing)


def create_docs_app() -> FastStream:
    """The FastStream app as AsyncAPI sees it (nothing connects)."""
    broker = NatsBroker("nats://localhost:4222")
    metrics = FleetMetrics()
    broker.include_router(AssemblerWorker(None, NoticeBoard(), metrics).router)
    broker.include_router(BudgeterWorker(None, None, metrics).router)
    broker.include_router(CompactorWorker(None, metrics).router)
    broker.include_router(manual_router(None, Responder(None, 1)))
    broker.include_router(IndexerWorker(None, metrics).router)
    return FastStream(broker)
