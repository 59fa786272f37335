"""assembler: answers ``ctx.prepare``, ``ctx.inspect`` and ``ctx.context`` (``.<tenant>.<run>.<instance>``).

The tenant is the subject's: the NATS server only delivers a request there from an identity its
permissions allow on that tenant's subjects, so no payload can claim another tenant.

Core NATS request/reply in the ``assembler`` queue group, so replicas share the load. Bodies are
decoded raw: a bad request must get a typed error reply, which FastStream's own validation
(failing before the handler runs) could not give.

Requests are handled concurrently: each runs in a task of its own (``workers/responder.py``), up to
``RequestLimits.max_tasks`` per endpoint, and one ``Admission`` per process bounds how many compute
(see ``workers/admission.py``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from faststream.nats import NatsResponse, NatsRouter
from opentelemetry.trace import Span
from pydantic import BaseModel

from contracts import (
    CONTEXT_SHOW,
    ContextRequest,
    ContextShown,
    ErrorCode,
    InspectRequest,
    PrepareRequest,
    ThreadInspection,
    reply_json,
)
from contracts.subjects import INSPECT, PREPARE, RECORDED
from contracts.windows import WaterLevel
from contracts.exceptions import CtxError
from services.app.final_checks import GatewayService
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.showing import show_context
from services.app.tracing import Tracing, record_error, record_prepared, record_rollover
from services.core.budget import BUILTIN_PROFILES
from services.store.postgres import PgStore

from .admission import Admission, RequestLimits, Slot
from .level_clock import LevelClock
from .final_check import gateway_router
from .metrics import FleetMetrics, policy_label
from .prepares_first import PreparesFirst
from .queries import queries_router
from .replies import Inbound, admitted, error_reply, inbound, parse_body, reply_with, require_subject_thread
from .responder import Responder

__all__ = ["AssemblerWorker"]

log = logging.getLogger("ctxfleet.assembler")


class AssemblerWorker:
    """The assembler's handlers, bound to one PrepareService."""

    def __init__(
        self,
        service: PrepareService | None,
        board: NoticeBoard,
        metrics: FleetMetrics,
        store: PgStore | None = None,
        *,
        limits: RequestLimits | None = None,
        gateway: GatewayService | None = None,
        responder: Responder | None = None,
        tracing: Tracing | None = None,
        prepares: PreparesFirst | None = None,
    ) -> None:
        self._service = service
        # Counts this process's prepares in progress, which its background passes wait for.
        self._prepares = prepares or PreparesFirst()
        self._store = store
        self._tracing = tracing or Tracing.off()
        self._gateway = gateway
        self._board = board
        self._metrics = metrics
        self._reply_stage = metrics.prepare_stage_seconds.labels(stage="reply")
        self._levels = LevelClock()
        self.admission = Admission(limits or RequestLimits(), metrics)
        # Answers prepare, inspect, the gateway check and the queries; without one they are declared
        # (for the AsyncAPI document), never served.
        self.responder = responder or Responder(None, self.admission.limits.max_tasks)
        self.router = NatsRouter()
        self._register()
        self.router.include_router(queries_router(store, metrics, self.admission, self.responder))
        self.router.include_router(gateway_router(gateway, metrics, self.admission, self.responder))

    def _register(self) -> None:
        r, admission, responder = self.router, self.admission, self.responder

        @responder.endpoint(
            r,
            f"{PREPARE}.{{tenant}}.{{run_id}}.{{instance_id}}",
            queue="assembler",
            title="prepare",
        )
        async def on_prepare(message: Inbound) -> NatsResponse:
            tenant, run_id, instance_id = message.tokens(3)
            with (
                self._prepares.serving(),
                self._tracing.prepare(message.headers, f"{run_id}.{instance_id}", tenant) as span,
            ):
                return await admitted(
                    admission,
                    message.headers,
                    lambda slot: self._prepare(message.body, tenant, run_id, instance_id, slot, span),
                )

        def thread_query(
            subject: str, title: str, answer: Callable[[bytes, str, str], Awaitable[BaseModel]]
        ) -> None:
            @responder.endpoint(
                r, f"{subject}.{{tenant}}.{{run_id}}.{{instance_id}}", queue="assembler", title=title
            )
            async def on_request(message: Inbound) -> NatsResponse:
                tenant, run_id, instance_id = message.tokens(3)
                return await admitted(
                    admission,
                    message.headers,
                    lambda _slot: reply_with(lambda: answer(message.body, tenant, f"{run_id}.{instance_id}")),
                )

        thread_query(INSPECT, "inspect", self._inspect)
        thread_query(CONTEXT_SHOW, "context_show", self._show)

        # Notices are never answered, whatever reply subject they carry: only requests are, by the
        # responder, and only to the requester's inbox (workers/responder.py, invariant 5).
        for subject, title in ((RECORDED, "recorded"), ("ctx.compacted", "compacted")):

            @r.subscriber(
                f"{subject}.{{run_id}}.{{instance_id}}", decoder=inbound, no_reply=True, title=title
            )
            async def on_notice(message: Inbound) -> None:
                run_id, instance_id = message.tokens(2)
                self._board.notify(f"{run_id}.{instance_id}")

    async def _prepare(
        self, body: bytes, tenant: str, run_id: str, instance_id: str, slot: Slot, span: Span
    ) -> NatsResponse:
        started = time.perf_counter()
        purpose = "unknown"
        try:
            request = parse_body(PrepareRequest, body)
            purpose = request.purpose.value
            require_subject_thread(request.run_id, request.instance_id, f"{run_id}.{instance_id}")
            prepared = await self._require_service().prepare(request, tenant=tenant, pause=slot)
            answered = time.perf_counter()
            answer = reply_json(prepared)
            self._reply_stage.observe(time.perf_counter() - answered)
            if self._gateway is not None:
                # Refused (overloaded) when its record could not be kept: no answer the check then lacks.
                self._gateway.remember(
                    prepared, tenant, carried_from=request.carry_additions_from, sent=answer
                )
        except Exception as exc:
            reply = error_reply(exc)
            self._metrics.prepare_errors.labels(code=reply.code.value).inc()
            if span.is_recording():
                record_error(span, reply.code.value, reply.message)
            if reply.code is ErrorCode.PROVIDER_CONTEXT_EXCEEDED:
                profile = _profile_label(str(reply.details.get("profile", "")))
                self._metrics.provider_overflows.labels(profile=profile, outcome="refused").inc()
            if reply.code is ErrorCode.CONTEXT_BUDGET_EXCEEDED:
                reason = "history" if "waited_ms" in reply.details else "required"
                self._metrics.budget_overflows.labels(reason=reason).inc()
                if reason == "history":
                    self._metrics.prepare_compaction_waits.labels(outcome="timed_out").inc()
            return NatsResponse(reply_json(reply), headers={"ctx-status": "error"})
        report = prepared.budget_report
        if span.is_recording():
            record_prepared(span, prepared)
            record_rollover(self._tracing, f"{run_id}.{instance_id}", prepared, time.time_ns())
        if request.after_overflow is not None:
            self._metrics.provider_overflows.labels(
                profile=_profile_label(report.profile), outcome="recompacted"
            ).inc()
        m, policy = self._metrics, policy_label(prepared.policy)
        m.prepare_seconds.labels(purpose=purpose, policy=policy).observe(answered - started)
        m.prepare_budget_ratio.labels(purpose=purpose).observe(report.used.total / report.input_budget)
        m.prepare_input_tokens.labels(purpose=purpose, policy=policy, calibration=report.calibration).observe(
            report.estimated_input
        )
        m.prepare_budget_tokens.labels(purpose=purpose, policy=policy).observe(report.input_budget)
        for reduction in prepared.reductions:
            m.prepare_reductions.labels(kind=reduction.split(":")[0]).inc()
        if prepared.window_report is not None:
            self._observe_level(f"{run_id}.{instance_id}", prepared.window_report.level)
        if prepared.compaction_wait_ms:
            # Served after the wait either way; "timed_out" when no compaction landed in time and the
            # oldest history awaiting it was left out instead.
            landed = prepared.budget_report.reductions.dropped_history == 0
            m.prepare_compaction_waits.labels(outcome="landed" if landed else "timed_out").inc()
            m.prepare_compaction_wait_seconds.observe(prepared.compaction_wait_ms / 1000)
        if prepared.rollover is not None:
            m.window_rollovers.labels(trigger=prepared.rollover.trigger.value).inc()
            m.window_handoff_tokens.observe(prepared.rollover.handoff_tokens)
            m.window_rollover_seconds.observe(prepared.rollover.rollover_ms / 1000)
        return NatsResponse(answer, headers={"ctx-status": "ok"})

    def _observe_level(self, thread_id: str, level: WaterLevel) -> None:
        self._metrics.window_level_prepares.labels(level=level.value).inc()
        lasted = self._levels.advance(thread_id, level, time.monotonic())
        if lasted is not None:
            self._metrics.window_level_seconds.labels(level=lasted[0].value).inc(lasted[1])

    async def _inspect(self, body: bytes, tenant: str, thread_id: str) -> ThreadInspection:
        request = parse_body(InspectRequest, body) if body else InspectRequest()
        return await self._require_service().inspect(thread_id, request, tenant=tenant)

    async def _show(self, body: bytes, tenant: str, thread_id: str) -> ContextShown:
        request = parse_body(ContextRequest, body) if body else ContextRequest()
        if self._store is None:
            raise CtxError("assembler has no store attached")
        return await show_context(self._store, self._require_service(), thread_id, request, tenant=tenant)

    def _require_service(self) -> PrepareService:
        if self._service is None:
            raise CtxError("assembler has no store attached")
        return self._service


def _profile_label(profile: str) -> str:
    # Built-in names only: a request's own profile or bare budget would make the label unbounded.
    return profile if profile in BUILTIN_PROFILES else "custom"
