"""compactor: takes compaction jobs from the work queue (any replica, each job to one) and runs them.

A job is acked once it reached a final outcome — committed, deferred, failed, dropped or stale —
all recorded in the view state; only an unavailable store makes it come back (nak with delay).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable

from faststream import AckPolicy
from faststream.nats import JStream, NatsMessage, NatsRouter, PullSub

from contracts import COMPACTION_JOBS, JOBS_STREAM, CompactionJob, compacted_subject
from services.app.compacting import CompactionService
from contracts.exceptions import CtxError

from .metrics import FleetMetrics

__all__ = ["COMPACTOR_DURABLE", "CompactorWorker", "Notify"]

Notify = Callable[[str, bytes], Awaitable[None]]

log = logging.getLogger("ctxfleet.compactor")
COMPACTOR_DURABLE = "compactor"
_HEARTBEAT_S = 10.0


class CompactorWorker:
    """Runs jobs with one CompactionService."""

    def __init__(
        self, service: CompactionService | None, metrics: FleetMetrics, notify: Notify | None = None
    ) -> None:
        self._service = service
        self._metrics = metrics
        self._notify = notify
        self.router = NatsRouter()

        @self.router.subscriber(
            COMPACTION_JOBS,
            stream=JStream(JOBS_STREAM, declare=False),
            durable=COMPACTOR_DURABLE,
            pull_sub=PullSub(batch_size=1, timeout=1.0),
            ack_policy=AckPolicy.MANUAL,
            # FastStream would answer a job's ``reply_to`` header; a job is never answered.
            no_reply=True,
            title="compactor",
            description="Compaction jobs (work queue): one job to one replica.",
        )
        async def on_job(job: CompactionJob, msg: NatsMessage) -> None:
            await self._handle(job, msg)

    async def _handle(self, job: CompactionJob, msg: NatsMessage) -> None:
        if self._service is None:
            await msg.nack(delay=5.0)
            return
        started = time.perf_counter()
        beat = asyncio.create_task(_heartbeat(msg))
        try:
            outcome = await self._service.run(job)
        except CtxError as exc:
            if exc.retryable:
                delivered = msg.raw_message.metadata.num_delivered
                await msg.nack(delay=min(60.0, 2.0**delivered))
                return
            log.error("job %s for %s failed: %s", job.job_id, job.thread_id, exc)
            self._metrics.compactions.labels(result="failed", stage="error").inc()
            await msg.ack()
            return
        finally:
            beat.cancel()
        self._metrics.compaction_seconds.observe(time.perf_counter() - started)
        self._metrics.compactions.labels(result=outcome.status, stage=outcome.stage).inc()
        if outcome.calls:
            name = outcome.summarizer or "unknown"
            self._metrics.summarizer_calls.labels(summarizer=name).inc(outcome.calls)
            self._metrics.summarizer_seconds.labels(summarizer=name).observe(outcome.summarizer_seconds)
            self._metrics.summarizer_tokens.labels(summarizer=name, direction="input").inc(
                outcome.input_tokens
            )
            self._metrics.summarizer_tokens.labels(summarizer=name, direction="output").inc(
                outcome.output_tokens
            )
        if outcome.status == "committed":
            self._metrics.compaction_before_tokens.observe(outcome.tokens_before)
            self._metrics.compaction_after_tokens.observe(outcome.tokens_after)
            self._metrics.compaction_target.labels(reached=str(outcome.target_reached).lower()).inc()
        elif outcome.status == "dropped":
            self._metrics.revision_conflicts.labels(where="compaction_commit").inc()
        await msg.ack()
        # Wake prepares waiting on this thread whatever happened: a failure ends their wait too.
        if self._notify is not None:
            body = json.dumps({"status": outcome.status, "view_revision": outcome.view_revision}).encode()
            await self._notify(compacted_subject(job.thread_id), body)


async def _heartbeat(msg: NatsMessage) -> None:
    # A long summarization must not be redelivered to another replica while it is still running.
    while True:
        await asyncio.sleep(_HEARTBEAT_S)
        await msg.in_progress()
