"""The compaction work queue on JetStream (stream CTX_JOBS, subject ctx.compaction.jobs)."""

from __future__ import annotations

from nats.js import JetStreamContext

from contracts import COMPACTION_JOBS, JOBS_STREAM, CompactionJob

__all__ = ["JetStreamJobQueue"]


class JetStreamJobQueue:
    """Publishes jobs with ``Nats-Msg-Id`` = job id, so the same state is queued once."""

    def __init__(self, js: JetStreamContext) -> None:
        self._js = js

    async def publish(self, job: CompactionJob) -> None:
        """Enqueue one job (a duplicate within the stream's window is dropped by the server)."""
        await self._js.publish(
            COMPACTION_JOBS, job.model_dump_json().encode(), stream=JOBS_STREAM, headers={"Nats-Msg-Id": job.job_id}, timeout=10.0
        )
