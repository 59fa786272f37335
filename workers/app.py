"""Composition: the workers of one process, wired to one pool, one broker and one registry.

All workers can run in one process (the embedded default) or one kind per process (k8s).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import asyncpg
import nats
from faststream import FastStream
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from prometheus_client import start_http_server

from contracts import DeadLetter
from contracts.subjects import DEAD
from services.ledger import RecordingLimits
from services.notices import NoticeBoard
from services.preparing import PrepareService
from services.settings import Settings

from .assembler import AssemblerWorker
from .metrics import FleetMetrics
from .recorder import RecorderWorker

__all__ = ["Fleet", "create_docs_app", "recording_limits"]

log = logging.getLogger("ctxfleet")


def recording_limits(settings: Settings) -> RecordingLimits:
    """The recorder limits a settings object describes."""
    return RecordingLimits(
        max_event_bytes=settings.max_event_bytes,
        blob_min_bytes=settings.blob_min_bytes,
        tool_result_max_tokens=settings.tool_result_max_tokens,
    )


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
    broker.include_router(AssemblerWorker(None, NoticeBoard(), FleetMetrics()).router)
    _document_outputs(broker)
    return FastStream(broker)


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
    _recorder_nc: NatsClient | None = None

    async def start(self) -> None:
        """Connect and start every configured worker."""
        s = self.settings
        self.pool = await asyncpg.create_pool(self.database_url, min_size=2, max_size=s.db_pool_size)
        if "assembler" in s.worker_names:
            board = NoticeBoard()
            self.broker = NatsBroker(self.nats_url, name=f"ctxfleet-assembler-{s.recorder_id}", logger=None)
            self.broker.include_router(AssemblerWorker(PrepareService(self.pool, board), board, self.metrics).router)
            await self.broker.start()
        if "recorder" in s.worker_names:
            self._recorder_nc = await nats.connect(self.nats_url, name=f"ctxfleet-recorder-{s.recorder_id}")
            self.recorder = RecorderWorker(
                self._recorder_nc,
                self.pool,
                self.metrics,
                partitions=s.owned_partitions(),
                limits=recording_limits(s),
                recorder_id=s.recorder_id,
                batch=s.record_batch,
            )
            await self.recorder.start()
        if s.metrics_port:
            start_http_server(s.metrics_port, addr="127.0.0.1", registry=self.metrics.registry)
        log.info("workers %s started", ", ".join(s.worker_names))

    async def stop(self) -> None:
        """Stop pulling, finish what is in hand, close connections. Safe to call twice."""
        recorder, nc, broker, pool = self.recorder, self._recorder_nc, self.broker, self.pool
        self.recorder = self._recorder_nc = self.broker = self.pool = None
        if recorder is not None:
            await recorder.stop()
        if nc is not None and not nc.is_closed:
            await nc.drain()
        if broker is not None:
            await broker.stop()
        if pool is not None:
            await pool.close()
