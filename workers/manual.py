"""Manual compaction: answers ``ctx.compact.<tenant>.<run>.<instance>`` in the compactor process.

The tenant is the subject's (the server's permissions vouch for it). Served in the ``compactor``
queue group, beside the job queue, one request at a time per process: a summarizer call may take
seconds, and the assembler's compute slots are for prepares. Answered by the process's responder,
like every request (``workers/responder.py``). After a commit the thread's prepares are woken, as
after a queued job.
"""

from __future__ import annotations

import json

from faststream.nats import NatsResponse, NatsRouter

from contracts import COMPACT, CompactReply, CompactRequest, compacted_subject
from services.app.manual_compaction import ManualCompaction
from contracts.exceptions import CtxError

from .compactor import Notify
from .metrics import FleetMetrics
from .replies import Inbound, parse_body, reply_with, require_subject_thread
from .responder import Responder

__all__ = ["manual_router"]


def manual_router(
    service: ManualCompaction | None,
    responder: Responder,
    notify: Notify | None = None,
    metrics: FleetMetrics | None = None,
) -> NatsRouter:
    """The router of ``ctx.compact``, bound to one manual-compaction service and the process's responder."""
    router = NatsRouter()

    @responder.endpoint(
        router,
        f"{COMPACT}.{{tenant}}.{{run_id}}.{{instance_id}}",
        queue="compactor",
        max_tasks=1,
        title="compact",
    )
    async def on_compact(message: Inbound) -> NatsResponse:
        tenant, run_id, instance_id = message.tokens(3)
        body = message.body

        async def run() -> CompactReply:
            if service is None:
                raise CtxError("this process has no store attached")
            request = parse_body(CompactRequest, body)
            require_subject_thread(request.run_id, request.instance_id, f"{run_id}.{instance_id}")
            try:
                reply = await service.compact(request, tenant=tenant)
            except CtxError as exc:
                if metrics is not None:
                    metrics.manual_compactions.labels(outcome=exc.code).inc()
                raise
            if metrics is not None:
                metrics.manual_compactions.labels(outcome="committed").inc()
                metrics.compaction_before_tokens.observe(reply.tokens_before)
                metrics.compaction_after_tokens.observe(reply.tokens_after)
            if notify is not None:
                notice = {"status": "committed", "view_revision": reply.view_revision}
                await notify(compacted_subject(reply.thread_id), json.dumps(notice).encode())
            return reply

        return await reply_with(run)

    return router
