"""The compaction work queue on JetStream (stream CTX_JOBS, subject ctx.compaction.jobs)."""

from __future__ import annotations

from nats.js import JetStreamContext

from contracts import COMPACTION_JOBS, JOBS_STREAM, CompactionJob

from .metrics import FleetMetrics

__all__ = ["CountedJobQueue", "JetStreamJobQueue"]


class JetStreamJobQueue:
    """Publishes jobs with ``Nats-Msg-Id`` = job id, so the same state is queued once."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js

    async def publish(self, job: CompactionJob) -> None:
        """Enqueue one job (a duplicate within the stream's window is dropped by the server)."""
        await self._js.publish(
            COMPACTION_JOBS,
            job.model_dump_json().encode(),
            stream=JOBS_STREAM,
            headers={"Nats-Msg-Id": job.job_id},
            timeout=10.0,
        )


class CountedJobQueue:
    """A queue that counts what it enqueues as trigger hits and jobs, for enqueuers without their own counts.

    The budgeter counts its evaluations itself; the urgent jobs prepares ask for (``hard_budget``)
    go through this, so dashboards see every compaction's cause, not only the budgeter's.
    """

    def __init__(self, inner: JetStreamJobQueue, metrics: FleetMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    async def publish(self, job: CompactionJob) -> None:
        """Enqueue one job and count it."""
        await self._inner.publish(job)
        policy = f"{job.policy_name}@{job.policy_revision}"
        for reason in job.reasons:
            self._metrics.trigger_hits.labels(condition=reason, policy=policy).inc()
        self._metrics.jobs.labels(outcome="enqueued", reason="+".join(job.reasons)).inc()
