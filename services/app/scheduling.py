"""Putting compaction jobs on the queue: one pending job per thread, named by the state it covers."""

from __future__ import annotations

from typing import Protocol

from contracts import CompactionJob

from services.core.compaction.policy import job_fingerprint
from services.store.ports import ViewWrites
from services.app.views import ThreadView

__all__ = [
    "JobQueue",
    "PENDING_STALE_S",
    "request_job",
]

# A job that has not finished in this long is presumed lost (its compactor died past redelivery).
PENDING_STALE_S = 300.0


class JobQueue(Protocol):
    """The work queue of compaction jobs; publishing the same job id twice must store it once."""

    async def publish(self, job: CompactionJob) -> None:
        """Enqueue one job."""


async def request_job(
    store: ViewWrites,
    queue: JobQueue,
    view: ThreadView,
    reasons: tuple[str, ...],
    *,
    urgent: bool = False,
    input_budget: int | None = None,
    reserved_tokens: int = 0,
) -> CompactionJob | None:
    """Enqueue a job for the view's current state unless the thread already has one pending.

    ``input_budget`` (a prepare's own, smaller budget) overrides the policy's for an urgent job;
    ``reserved_tokens`` is what that prepare needs besides the view (its tool schemas).
    """
    budget = min(view.budget.input_budget, input_budget) if input_budget else view.compaction_budget
    reserved_tokens = reserved_tokens if input_budget else max(reserved_tokens, view.state.prepare_reserved)
    fingerprint = job_fingerprint(
        view.head.thread_id,
        view.watermark,
        view.state.view_revision,
        view.policy_name,
        view.policy_revision,
        budget,
        urgent=urgent,
    )
    await store.ensure_view(view.head.thread_id)
    if urgent and input_budget and input_budget < view.budget.input_budget:
        await store.note_prepare_budget(view.head.thread_id, budget, reserved_tokens)
    if not await store.set_pending(view.head.thread_id, fingerprint, stale_after_s=PENDING_STALE_S):
        return None
    job = CompactionJob(
        job_id=fingerprint,
        thread_id=view.head.thread_id,
        session_id=view.head.session_id,
        watermark=view.watermark,
        view_revision=view.state.view_revision,
        policy_name=view.policy_name,
        policy_revision=view.policy_revision,
        input_budget=budget,
        reasons=reasons,
        urgent=urgent,
        reserved_tokens=reserved_tokens,
    )
    try:
        await queue.publish(job)
    except BaseException:
        await store.clear_pending(view.head.thread_id, fingerprint)
        raise
    return job
