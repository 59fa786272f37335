"""The budgeter's service: evaluate the policy against a thread's view after its ledger moved."""

from __future__ import annotations

from dataclasses import dataclass

from contracts import CompactionPolicy
from contracts.windows import WindowStrategy

from services.core.compaction.policy import (
    Decision,
    ViewMeasure,
    cache_cold,
    decide,
    throttle_from,
    trigger_hits,
)
from services.core.assemble import ThreadSnapshot, shown_blocks, view_sizes
from services.core.compaction.select import measure_view
from services.core.groups import BlockSet, DraftBlock, build_view_blocks
from services.core.records import LedgerRecord
from services.core.tokens import counter_for
from services.app.scheduling import PENDING_STALE_S, IdleSpell, JobQueue, request_job
from services.store.ports import BudgetStore
from services.app.view_cache import last_blocks
from services.app.views import ThreadView, ViewLoader

__all__ = ["BudgetService", "Evaluation", "measure", "pass_over"]


def measure(
    view: ThreadView,
    records: list[LedgerRecord],
    policy: CompactionPolicy | None = None,
    *,
    budget: int,
    reserved: int,
    previous: BlockSet | None = None,
    snapshot: ThreadSnapshot | None = None,
) -> tuple[ViewMeasure, list[DraftBlock], dict[str, int]]:
    """How ``records`` of the view measure against ``budget``, with ``reserved`` tokens (the tool
    schemas a prepare sends beside the view) counted as required; the blocks eligible to compact,
    and every shown block's tokens (``view_sizes``).

    The one measure of a view: the budgeter's decision, the compactor's cover and its throttle must
    agree, or a retry check would see a change that is not one. ``previous``: a build of the view's
    blocks to extend (``build_view_blocks``); the measure is the same without it. ``snapshot``: the
    view as a summary about to be committed would leave it (default: as it is).
    """
    # What the assembler is given: past a rollover, the window's handoff replaces what it closed.
    snapshot = snapshot or view.snapshot()
    blocks = build_view_blocks(
        records,
        snapshot.covered_to,
        covered_from=snapshot.covered_from,
        own_thread=snapshot.own_thread,
        previous=previous,
    )
    shown = shown_blocks(snapshot, blocks)
    sizes = view_sizes(shown, counter_for(view.encoding), snapshot.summary)
    measured, eligible = measure_view(
        shown, sizes, blocks, policy or view.policy.compaction, budget, reserved=reserved
    )
    return measured, eligible, sizes


@dataclass(frozen=True)
class Evaluation:
    """What the budgeter saw and did for one thread."""

    decision: Decision
    estimated: int
    budget: int
    enqueued: bool
    policy_name: str
    # The budget profile the thread is served under: whose prompt cache its calls use.
    profile: str = ""


class BudgetService:
    """Evaluates threads and enqueues compaction jobs."""

    def __init__(self, store: BudgetStore, loader: ViewLoader, queue: JobQueue) -> None:
        self._store = store
        self._loader = loader
        self._queue = queue

    async def evaluate(self, thread_id: str) -> Evaluation:
        """Evaluate one thread at its current head; at most one job results, whatever the hits."""
        async with self._store.connection() as store:
            view = await self._loader.load(store, thread_id)
            policy = view.policy.compaction
            measured, _, _ = measure(
                view,
                view.records,
                budget=view.compaction_budget,
                reserved=view.state.prepare_reserved,
                # What the thread's last prepare built: the budgeter follows it by a batch or so.
                previous=last_blocks(
                    self._loader.cache, thread_id, summarized=view.state.summary is not None
                ),
            )
            pending = _job_pending(view)
            decision = decide(
                measured, view.totals, view.baseline, policy, throttle=view.state.throttle, pending=pending
            )
            enqueued = False
            if decision.action == "enqueue" and view.policy.window.strategy is WindowStrategy.ROLLOVER:
                pass  # a rollover thread is not summarized: its prepare closes the window
            elif decision.action == "enqueue":
                enqueued = await request_job(store, self._queue, view, decision.hits) is not None
            elif decision.action == "defer":
                await store.ensure_view(thread_id)
                hits = trigger_hits(measured, view.totals, view.baseline, policy)
                await store.record_attempt(
                    thread_id,
                    throttle=throttle_from(decision.reason, measured, view.totals, hits),
                    reason=decision.reason,
                    failed=False,
                    fingerprint=None,
                    counts_as_attempt=False,
                )
            await store.ensure_view(thread_id)
            await store.mark_evaluated(thread_id, view.head.revision)
        return Evaluation(
            decision, measured.estimated, measured.budget, enqueued, view.policy_name, view.budget.profile
        )

    async def evaluate_idle(self, spell: IdleSpell) -> Evaluation:
        """Compact a thread that idled into a cold cache (``cache_cold``), covering all eligible.

        Its next step re-sends the whole context uncached anyway, so the compaction costs no cache
        read; the budgeter's other rules do not hold it back (a pending job already does the work).
        """
        async with self._store.connection() as store:
            view = await self._loader.load(store, spell.thread_id)
            measured, _, _ = measure(
                view, view.records, budget=view.compaction_budget, reserved=view.state.prepare_reserved
            )
            pending = _job_pending(view)
            rollover = view.policy.window.strategy is WindowStrategy.ROLLOVER
            decision = Decision("none")
            enqueued = False
            if not rollover and cache_cold(measured, spell.idle_s, spell.ttl_s):
                if pending:
                    decision = Decision("pending", ("idle",), "a job for this thread is already queued")
                else:
                    decision = Decision("enqueue", ("idle",))
                    enqueued = await request_job(store, self._queue, view, ("idle",)) is not None
        return Evaluation(
            decision, measured.estimated, measured.budget, enqueued, view.policy_name, view.budget.profile
        )


def _job_pending(view: ThreadView) -> bool:
    """A job for the thread is queued and not yet presumed lost."""
    return view.state.pending_fingerprint is not None and (view.state.pending_age_s or 0) < PENDING_STALE_S


async def pass_over(store: BudgetStore, thread_id: str) -> None:
    """Mark ``thread_id`` evaluated at its head without evaluating it: an evaluation that failed for
    what the thread holds would fail again, and the budgeter's sweep would find it every round.
    The thread's next records make it due again."""
    async with store.connection() as session:
        head = await session.select_head(thread_id)
        if head is None:
            return
        await session.ensure_view(thread_id)
        await session.mark_evaluated(thread_id, head.revision)
