"""A manual compaction (``/compact``): the compactor's job, run now and answered.

The job is the budgeter's kind, for the view as it is, under the session's policy — only no trigger
decides: whatever the policy lets go is covered. It goes through :class:`CompactionService`, so a
manual summary is validated, sized and committed exactly like an automatic one, and the view's
compare-and-set keeps it from double-covering a concurrent automatic commit. A lost race is retried
on the fresh view a few times; every other outcome is the answer.
"""

from __future__ import annotations

from contracts import CompactionJob, CompactReply, CompactRequest, thread_id_of

from services.app.compacting import CompactionService, JobOutcome
from services.app.scheduling import compaction_job
from services.app.views import ThreadView, ViewLoader
from contracts.exceptions import CompactionFailed, NothingToCompact
from services.store.ports import CompactionStore

__all__ = ["MANUAL_REASON", "ManualCompaction"]

# The job's reason, as the compactor's logs and the summary's trigger_reasons show it.
MANUAL_REASON = "manual"
# A concurrent compaction moved the view: try again on the new one, but not for ever.
_ATTEMPTS = 3


class ManualCompaction:
    """Compacts one thread on request and reports the view before and after."""

    def __init__(self, store: CompactionStore, loader: ViewLoader, compaction: CompactionService) -> None:
        self._store = store
        self._loader = loader
        self._compaction = compaction

    async def compact(self, request: CompactRequest, *, tenant: str) -> CompactReply:
        """Commit a summary of everything the policy lets go in the request's thread.

        Raises:
            ThreadNotFound: no such thread, or it is another tenant's, session's or principal's.
            NothingToCompact: nothing outside the policy's recent groups and required content.
            CompactionFailed: the summarizer failed, its summary was invalid or did not reduce.
        """
        thread_id = thread_id_of(request.run_id, request.instance_id)
        outcome = JobOutcome("dropped")
        for _ in range(_ATTEMPTS):
            view = await self._view(request, tenant)
            # Never the budgeter's id for the same state: this job holds no pending slot to release.
            job = compaction_job(
                view,
                (MANUAL_REASON,),
                view.compaction_budget,
                view.state.prepare_reserved,
                id_prefix=f"{MANUAL_REASON}-",
            )
            outcome = await self._compaction.run(job)
            match outcome.status:
                case "committed":
                    return await self._reply(request, tenant, job, outcome)
                case "deferred":
                    raise NothingToCompact(thread_id, outcome.detail or outcome.stage)
                case "dropped" | "stale":
                    continue
                case _:
                    raise CompactionFailed(thread_id, outcome.stage or outcome.status, outcome.detail)
        raise CompactionFailed(
            thread_id, "commit", f"the view kept moving under {_ATTEMPTS} attempts: {outcome.detail}"
        )

    async def _view(self, request: CompactRequest, tenant: str) -> ThreadView:
        async with self._store.connection() as store:
            return await self._loader.load(
                store,
                thread_id_of(request.run_id, request.instance_id),
                tenant=tenant,
                session_id=request.session_id,
                principal_id=request.principal_id,
                enforce_principal=True,
            )

    async def _reply(
        self, request: CompactRequest, tenant: str, job: CompactionJob, outcome: JobOutcome
    ) -> CompactReply:
        summary = (await self._view(request, tenant)).state.summary
        if summary is None:  # committed, then reset by the runtime before we could read it back
            raise CompactionFailed(job.thread_id, "read_back", "the view has no summary after the commit")
        return CompactReply(
            thread_id=job.thread_id,
            summary_id=summary.summary_id,
            view_revision=outcome.view_revision,
            covered_from=summary.body.covered_from,
            covered_to=summary.body.covered_to,
            tokens_before=outcome.tokens_before,
            tokens_after=outcome.tokens_after,
            input_budget=job.input_budget,
            target_reached=outcome.target_reached,
            summarizer=outcome.summarizer,
            calls=outcome.calls,
        )
