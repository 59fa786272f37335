"""The compaction work queue on JetStream (stream CTX_JOBS, subject ctx.compaction.jobs)."""

from __future__ import annotations

from nats.errors import Error as NatsError
from nats.js import JetStreamContext

from contracts import COMPACTION_JOBS, JOBS_STREAM, CompactionJob
from contracts.exceptions import FleetUnavailable

from .metrics import FleetMetrics
from .refusals import Refusals, describe_publish_failure

__all__ = ["CountedJobQueue", "JetStreamJobQueue"]


class JetStreamJobQueue:
    """Publishes jobs with ``Nats-Msg-Id`` = job id, so the same state is queued once."""

    def __init__(self, js: JetStreamContext, refusals: Refusals | None = None) -> None:
        self._js = js
        self._refusals = refusals or Refusals()

    async def publish(self, job: CompactionJob) -> None:
        """Enqueue one job (a duplicate within the stream's window is dropped by the server).

        Raises:
            FleetUnavailable: JetStream did not store it (a full store answers at once).
        """
        try:
            await self._js.publish(
                COMPACTION_JOBS,
                job.model_dump_json().encode(),
                stream=JOBS_STREAM,
                headers={"Nats-Msg-Id": job.job_id},
                timeout=10.0,
            )
        except (NatsError, TimeoutError) as exc:
            why = describe_publish_failure(exc)
            self._refusals.refused("jetstream", why)
            raise FleetUnavailable(f"JetStream did not store the compaction job: {why}") from exc
        self._refusals.stored("jetstream")


class CountedJobQueue:
    """A queue that counts what it enqueues as trigger hits and jobs, for enqueuers without their own counts.

    The budgeter counts its evaluations itself; the urgent jobs prepares ask for (``hard_budget``)
    go through this, so dashboards see every compaction's cause, not only the budgeter's.
    """

    def __init__(self, inner: JetStreamJobQueue, metrics: FleetMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    async def publish(self, job: CompactionJob) -> None:
        await self._inner.publish(job)
        for reason in job.reasons:
            self._metrics.trigger_hits.labels(condition=reason, policy=job.policy_name).inc()
        self._metrics.jobs.labels(outcome="enqueued", reason="+".join(job.reasons)).inc()
