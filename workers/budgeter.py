"""budgeter: evaluates the policy after each recorded batch of a thread and enqueues compaction jobs.

Fed by recorder notices (``ctx.recorded.<thread>``, queue group ``budgeter``) and by a periodic
sweep of threads recorded past their last evaluation, so a lost notice or a restart only delays
an evaluation. Evaluations of one thread are coalesced: a notice during an evaluation schedules
exactly one more, at most one per 0.25 s while the thread keeps moving.

The same sweep finds the threads that have idled nearly their provider's cache TTL (``IdleWatch``):
each is evaluated once more, by the idle rule, so the step after its pause gets the smaller view.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from services.app.budgeting import BudgetService, Evaluation, pass_over
from services.app.scheduling import IdleWatch, cache_ttl_for
from contracts.exceptions import CtxError, FleetUnavailable, ThreadNotFound
from services.store.postgres import PgStore

from .coalescing import CoalescingScheduler, CoalescingWorker, recorded_notices
from .metrics import FleetMetrics
from .prepares_first import PreparesFirst

__all__ = ["BudgeterWorker"]

log = logging.getLogger("ctxfleet.budgeter")
_SWEEP_S = 2.0
# A thread being recorded into is evaluated at most this often, however many batches land (each
# evaluation loads and measures its view: one per batch takes CPU from the recorder).
_MIN_INTERVAL_S = 0.25


class BudgeterWorker(CoalescingWorker):
    """Coalescing evaluator of threads."""

    def __init__(
        self,
        service: BudgetService | None,
        store: PgStore | None,
        metrics: FleetMetrics,
        *,
        prepares: PreparesFirst | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._service = service
        self._store = store
        self._metrics = metrics
        self._idle = IdleWatch(clock)
        ready = service is not None and store is not None
        self._scheduler = (
            CoalescingScheduler(
                self._evaluate,
                self._stale,
                log,
                sweep_s=_SWEEP_S,
                min_interval_s=_MIN_INTERVAL_S,
                before_pass=prepares.before_pass if prepares is not None else None,
            )
            if ready
            else None
        )
        self.router = recorded_notices(
            "budgeter", "Recorder notices: evaluate the thread's compaction policy.", self.schedule
        )

    async def _evaluate(self, thread_id: str) -> None:
        assert self._service is not None
        spell = self._idle.take(thread_id)
        try:
            if spell is not None:
                result = await self._service.evaluate_idle(spell)
            else:
                result = await self._service.evaluate(thread_id)
                self._idle.moved(thread_id, cache_ttl_for(result.profile))
        except ThreadNotFound:
            return  # a notice for a thread whose only events were rejected
        except FleetUnavailable:
            # JetStream refused the job (a full store): not marked evaluated, so the sweep asks again.
            self._metrics.jobs.labels(outcome="not_queued", reason="jetstream").inc()
            raise
        except CtxError as exc:
            if exc.retryable:
                raise  # a store or NATS outage: the scheduler logs it once, the sweep tries again
            # Deterministic: passed over until the thread moves, so the sweep does not retry it for ever.
            assert self._store is not None
            await pass_over(self._store, thread_id)
            self._metrics.budgeter_failures.labels(code=exc.code.value).inc()
            log.warning("evaluating %s: %s; passed over until its next records", thread_id, exc)
            return
        self._count(result)

    def _count(self, result: Evaluation) -> None:
        d = result.decision
        for hit in d.hits:
            self._metrics.trigger_hits.labels(condition=hit, policy=result.policy_name).inc()
        if d.action == "enqueue":
            self._metrics.jobs.labels(
                outcome="enqueued" if result.enqueued else "deduplicated", reason="+".join(d.hits)
            ).inc()
        elif d.action in ("defer", "throttled", "pending"):
            outcome = {"defer": "deferred", "throttled": "throttled", "pending": "deduplicated"}[d.action]
            self._metrics.jobs.labels(outcome=outcome, reason=d.reason.split(":")[0][:40]).inc()

    async def _stale(self) -> list[str]:
        assert self._store is not None
        # An idle thread is due by the clock, not by its records: the store cannot name it.
        return [*await self._store.stale_views(200), *self._idle.due()]
