"""Composition: the workers of one process, wired to one pool, one broker and one registry.

All workers can run in one process (the embedded default) or one kind per process (k8s).
"""

from __future__ import annotations

import asyncio
import logging
import re
from datetime import UTC, datetime
from dataclasses import dataclass, field

import asyncpg
import nats
from faststream import FastStream
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from prometheus_client import start_http_server

from contracts import JOBS_STREAM, DeadLetter
from contracts.subjects import DEAD
from services.budgeting import BudgetService
from services.compacting import CompactionService, SummarizerFactory
from services.compaction.http_summarizer import HttpSummarizer, HttpSummarizerConfig
from services.compaction.model import Summarizer
from services.compaction.structured import StructuredSummarizer
from services.ledger import RecordingLimits
from services.notices import NoticeBoard
from services.preparing import PrepareService
from services.records import LedgerRecord
from services.settings import Settings
from services.views import ViewLoader

from .assembler import AssemblerWorker
from .budgeter import BudgeterWorker
from .compactor import CompactorWorker
from .indexer import IndexerWorker
from .jobs import JetStreamJobQueue
from .metrics import FleetMetrics
from .recorder import RecorderWorker

__all__ = ["Fleet", "create_docs_app", "recording_limits", "summarizer_factory"]

log = logging.getLogger("ctxfleet")


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


async def _watch_queue(nc: NatsClient, metrics: FleetMetrics, every_s: float = 5.0) -> None:
    """Export the compaction queue's depth and oldest job age (what operators scale compactors on)."""
    js = nc.jetstream(timeout=5.0)
    while True:
        try:
            info = await js.stream_info(JOBS_STREAM)
            metrics.queue_depth.set(info.state.messages)
            age = 0.0
            if info.state.messages:
                first = await js.get_msg(JOBS_STREAM, info.state.first_seq)
                stamp = first.time
                if isinstance(stamp, str):
                    stamp = _parse_nats_time(stamp)
                if isinstance(stamp, datetime):
                    age = (datetime.now(UTC) - stamp).total_seconds()
            metrics.queue_oldest_age.set(max(0.0, age))
        except Exception as exc:  # a metrics loop must never take the worker down
            log.debug("queue metrics: %s", exc)
        await asyncio.sleep(every_s)


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
    _nc: NatsClient | None = None
    _gauges: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Connect and start every configured worker."""
        s = self.settings
        names = s.worker_names
        self.pool = await asyncpg.create_pool(self.database_url, min_size=2, max_size=s.db_pool_size)
        self._nc = await nats.connect(self.nats_url, name=f"ctxfleet-{s.recorder_id}")
        queue = JetStreamJobQueue(self._nc.jetstream(timeout=10.0))
        loader = ViewLoader(self.pool)
        self.broker = NatsBroker(self.nats_url, name=f"ctxfleet-broker-{s.recorder_id}", logger=None)
        if "assembler" in names:
            board = NoticeBoard()
            service = PrepareService(self.pool, board, loader=loader, queue=queue, compaction_wait_ms=s.compaction_wait_ms)
            self.broker.include_router(AssemblerWorker(service, board, self.metrics, self.pool).router)
        if "budgeter" in names:
            self.budgeter = BudgeterWorker(BudgetService(self.pool, ViewLoader(self.pool), queue), self.pool, self.metrics)
            self.broker.include_router(self.budgeter.router)
        if "indexer" in names:
            self.indexer = IndexerWorker(self.pool, self.metrics)
            self.broker.include_router(self.indexer.router)
        if "compactor" in names:
            nc = self._nc

            async def notify(subject: str, body: bytes) -> None:
                await nc.publish(subject, body)

            compaction = CompactionService(self.pool, ViewLoader(self.pool), summarizer_factory(s))
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
        if "compactor" in names or "budgeter" in names:
            self._gauges = asyncio.create_task(_watch_queue(self._nc, self.metrics))
        if s.metrics_port:
            start_http_server(s.metrics_port, addr="127.0.0.1", registry=self.metrics.registry)
        log.info("workers %s started", ", ".join(names))

    async def stop(self) -> None:
        """Stop pulling, finish what is in hand, close connections. Safe to call twice."""
        recorder, budgeter, nc, broker, pool = self.recorder, self.budgeter, self._nc, self.broker, self.pool
        self.recorder = self.budgeter = self._nc = self.broker = self.pool = None
        if self._gauges is not None:
            self._gauges.cancel()
            await asyncio.gather(self._gauges, return_exceptions=True)
            self._gauges = None
        if recorder is not None:
            await recorder.stop()
        if broker is not None:
            await broker.stop()
        if budgeter is not None:
            await budgeter.stop()
        indexer, self.indexer = self.indexer, None
        if indexer is not None:
            await indexer.stop()
        if nc is not None and not nc.is_closed:
            await nc.drain()
        if pool is not None:
            await pool.close()
