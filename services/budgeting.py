"""The budgeter's service: evaluate the policy against a thread's view after its ledger moved."""

from __future__ import annotations

from dataclasses import dataclass, replace

import asyncpg

from .compaction.policy import Decision, decide, throttle_from, trigger_hits
from .compaction.select import measure_view
from .groups import build_view_blocks
from .scheduling import PENDING_STALE_S, JobQueue, request_job
from .store._errors import translate_pg_errors
from .store.views import ViewsRepo
from .views import ViewLoader

__all__ = ["BudgetService", "Evaluation"]


@dataclass(frozen=True)
class Evaluation:
    """What the budgeter saw and did for one thread."""

    decision: Decision
    estimated: int
    budget: int
    enqueued: bool
    policy_revision: str


class BudgetService:
    """Evaluates threads and enqueues compaction jobs."""

    def __init__(self, pool: asyncpg.Pool, loader: ViewLoader, queue: JobQueue) -> None:
        self._pool = pool
        self._loader = loader
        self._queue = queue

    async def evaluate(self, thread_id: str) -> Evaluation:
        """Evaluate one thread at its current head; at most one job results, whatever the hits."""
        async with self._pool.acquire() as conn:
            with translate_pg_errors(thread_id):
                view = await self._loader.load(conn, thread_id)
                policy = view.policy.compaction
                encoding = view.encoding
                blocks = build_view_blocks(view.records, view.state.covered_to, own_thread=thread_id)
                summary = view.state.summary
                measure, _ = measure_view(blocks, summary.tokens(encoding) if summary else 0, policy, encoding, view.compaction_budget)
                reserved = view.state.prepare_reserved
                measure = replace(measure, estimated=measure.estimated + reserved, required=measure.required + reserved)
                pending = view.state.pending_fingerprint is not None and (view.state.pending_age_s or 0) < PENDING_STALE_S
                decision = decide(measure, view.totals, view.baseline, policy, throttle=view.state.throttle, pending=pending)
                enqueued = False
                if decision.action == "enqueue":
                    enqueued = await request_job(conn, self._queue, view, decision.hits) is not None
                elif decision.action == "defer":
                    await ViewsRepo.ensure(conn, thread_id)
                    hits = trigger_hits(measure, view.totals, view.baseline, policy)
                    await ViewsRepo.record_attempt(
                        conn, thread_id, throttle=throttle_from(decision.reason, measure, view.totals, hits),
                        reason=decision.reason, failed=False, fingerprint=None, counts_as_attempt=False,
                    )
                await ViewsRepo.ensure(conn, thread_id)
                await ViewsRepo.mark_evaluated(conn, thread_id, view.head.revision)
        return Evaluation(decision, measure.estimated, measure.budget, enqueued, f"{view.policy_name}@{view.policy_revision}")
