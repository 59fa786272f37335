"""budgeter: evaluates the policy after each recorded batch of a thread and enqueues compaction jobs.

Fed by recorder notices (``ctx.recorded.<thread>``, queue group ``budgeter``) and by a periodic
sweep of threads recorded past their last evaluation, so a lost notice or a restart only delays
an evaluation. Evaluations of one thread are coalesced: a notice during an evaluation schedules
exactly one more.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from faststream import Path
from faststream.nats import NatsMessage, NatsRouter

from contracts.subjects import RECORDED
from services.budgeting import BudgetService
from services.errors import CtxError, ThreadNotFound
from services.store.views import ViewsRepo

from .metrics import FleetMetrics

__all__ = ["BudgeterWorker"]

log = logging.getLogger("ctxfleet.budgeter")
_SWEEP_S = 2.0


async def _raw_body(msg: NatsMessage) -> bytes:
    return msg.body


class BudgeterWorker:
    """Coalescing evaluator of threads."""

    def __init__(self, service: BudgetService | None, pool: asyncpg.Pool | None, metrics: FleetMetrics) -> None:
        self._service = service
        self._pool = pool
        self._metrics = metrics
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.router = NatsRouter()

        @self.router.subscriber(
            f"{RECORDED}.{{run_id}}.{{instance_id}}",
            queue="budgeter",
            decoder=_raw_body,
            title="budgeter",
            description="Recorder notices: evaluate the thread's compaction policy.",
        )
        async def on_recorded(body: bytes, run_id: str = Path(), instance_id: str = Path()) -> None:
            self.schedule(f"{run_id}.{instance_id}")

    def schedule(self, thread_id: str) -> None:
        """Evaluate ``thread_id`` soon (once more if an evaluation is running)."""
        if self._service is None:
            return
        if thread_id in self._running:
            self._again.add(thread_id)
            return
        self._running[thread_id] = asyncio.create_task(self._evaluate(thread_id))

    async def _evaluate(self, thread_id: str) -> None:
        assert self._service is not None
        try:
            while True:
                self._again.discard(thread_id)
                try:
                    result = await self._service.evaluate(thread_id)
                    d = result.decision
                    for hit in d.hits:
                        self._metrics.trigger_hits.labels(condition=hit, policy=result.policy_revision).inc()
                    if d.action == "enqueue":
                        self._metrics.jobs.labels(outcome="enqueued" if result.enqueued else "deduplicated", reason="+".join(d.hits)).inc()
                    elif d.action in ("defer", "throttled", "pending"):
                        outcome = {"defer": "deferred", "throttled": "throttled", "pending": "deduplicated"}[d.action]
                        self._metrics.jobs.labels(outcome=outcome, reason=d.reason.split(":")[0][:40]).inc()
                except ThreadNotFound:
                    pass  # a notice for a thread whose only events were rejected
                except CtxError as exc:
                    log.warning("evaluating %s: %s", thread_id, exc)
                if thread_id not in self._again:
                    return
        finally:
            self._running.pop(thread_id, None)

    async def start(self) -> None:
        """Start the catch-up sweep."""
        if self._pool is not None:
            self._sweeper = asyncio.create_task(self._sweep())

    async def stop(self) -> None:
        """Stop sweeping and let running evaluations finish."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def _sweep(self) -> None:
        assert self._pool is not None
        while True:
            try:
                async with self._pool.acquire() as conn:
                    for thread_id in await ViewsRepo.stale_threads(conn, 200):
                        self.schedule(thread_id)
            except Exception as exc:  # The sweep is a safety net; keep it alive through outages.
                log.warning("budgeter sweep: %s", exc)
            await asyncio.sleep(_SWEEP_S)
