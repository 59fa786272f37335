"""gateway: answers ``ctx.gateway.check.<tenant>.<run>.<instance>``, the final check before a model call.

Served in the ``assembler`` queue group by the processes that prepare, so a check usually lands
where its context is still cached; any replica can answer from the stored record. The tenant and
thread are the subject's (the server's permissions vouch for them).
"""

from __future__ import annotations

from faststream.nats import NatsResponse, NatsRouter


from contracts import GATEWAY_CHECK, FinalCheck, FinalCheckRequest, reply_json
from services.app.final_checks import GatewayService
from contracts.exceptions import CtxError

from .admission import Admission
from .metrics import FleetMetrics
from .replies import Inbound, admitted, error_reply, parse_body, require_subject_thread
from .responder import Responder

__all__ = ["gateway_router"]


def gateway_router(
    service: GatewayService | None, metrics: FleetMetrics, admission: Admission, responder: Responder
) -> NatsRouter:
    """The router of ``ctx.gateway.check``, bound to one gateway service and the process's admission
    and responder."""
    router = NatsRouter()

    @responder.endpoint(
        router,
        f"{GATEWAY_CHECK}.{{tenant}}.{{run_id}}.{{instance_id}}",
        queue="assembler",
        title="gateway_check",
    )
    async def on_check(message: Inbound) -> NatsResponse:
        tenant, run_id, instance_id = message.tokens(3)
        body = message.body

        async def run() -> NatsResponse:
            try:
                check = await _check(service, body, tenant, f"{run_id}.{instance_id}")
            except Exception as exc:
                reply = error_reply(exc)
                metrics.gateway_checks.labels(outcome=reply.code.value).inc()
                return NatsResponse(reply_json(reply), headers={"ctx-status": "error"})
            metrics.gateway_checks.labels(outcome=check.outcome).inc()
            return NatsResponse(reply_json(check), headers={"ctx-status": "ok"})

        return await admitted(admission, message.headers, lambda _slot: run())

    return router


async def _check(service: GatewayService | None, body: bytes, tenant: str, thread_id: str) -> FinalCheck:
    if service is None:
        raise CtxError("this process has no store attached")
    request = parse_body(FinalCheckRequest, body)
    require_subject_thread(request.run_id, request.instance_id, thread_id, "check")
    return await service.check(request, tenant=tenant, thread_id=thread_id)
