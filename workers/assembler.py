"""assembler: answers ``ctx.prepare.<run>.<instance>`` and ``ctx.inspect.<run>.<instance>``.

Core NATS request/reply in the ``assembler`` queue group, so replicas share the load. Bodies are
decoded raw: a bad request must get a typed error reply, which FastStream's own validation
(failing before the handler runs) could not give.
"""

from __future__ import annotations

import logging
import time
from typing import TypeVar

from faststream import Path
from faststream.nats import NatsMessage, NatsResponse, NatsRouter
from pydantic import ValidationError

import asyncpg

from contracts import (
    OPERATION_STATUS,
    OperationStatusRequest,
    TOOLS_REGISTER,
    CatalogRegistered,
    ToolCatalog,
    SESSION_INSPECT,
    POLICY_REGISTER,
    READ,
    ContextPolicy,
    ErrorCode,
    ErrorReply,
    InspectRequest,
    PolicyRegistered,
    PrepareRequest,
    ReadRequest,
)
from contracts.subjects import INSPECT, PREPARE, RECORDED
from services.budget import policy_budget
from services.errors import CtxError, InvalidPolicy, InvalidRequest
from services.notices import NoticeBoard
from services.preparing import PrepareService
from services.reading import read_range
from services.sessions import inspect_session
from services.catalogs import register_catalog
from services.receipts import operation_status
from services.store.views import PoliciesRepo

from .metrics import FleetMetrics

__all__ = ["AssemblerWorker"]

log = logging.getLogger("ctxfleet.assembler")


async def _raw_body(msg: NatsMessage) -> bytes:
    return msg.body


class AssemblerWorker:
    """The assembler's handlers, bound to one PrepareService."""

    def __init__(
        self, service: PrepareService | None, board: NoticeBoard, metrics: FleetMetrics, pool: asyncpg.Pool | None = None
    ) -> None:
        self._service = service
        self._pool = pool
        self._board = board
        self._metrics = metrics
        self.router = NatsRouter()
        self._register()

    def _register(self) -> None:
        r = self.router

        @r.subscriber(
            f"{PREPARE}.{{run_id}}.{{instance_id}}",
            queue="assembler",
            decoder=_raw_body,
            title="prepare",
            description="PrepareRequest in, PreparedContext or ErrorReply out (request/reply).",
        )
        async def on_prepare(body: bytes, run_id: str = Path(), instance_id: str = Path()) -> NatsResponse:
            return await self._prepare(body, run_id, instance_id)

        @r.subscriber(
            f"{INSPECT}.{{run_id}}.{{instance_id}}",
            queue="assembler",
            decoder=_raw_body,
            title="inspect",
            description="InspectRequest in, ThreadInspection or ErrorReply out (request/reply).",
        )
        async def on_inspect(body: bytes, run_id: str = Path(), instance_id: str = Path()) -> NatsResponse:
            return await self._inspect(body, f"{run_id}.{instance_id}")

        @r.subscriber(
            f"{RECORDED}.{{run_id}}.{{instance_id}}",
            decoder=_raw_body,
            title="recorded",
            description="Recorder notices: a thread's ledger moved (wakes waiting prepares).",
        )
        async def on_recorded(body: bytes, run_id: str = Path(), instance_id: str = Path()) -> None:
            self._board.notify(f"{run_id}.{instance_id}")

        @r.subscriber(
            f"{SESSION_INSPECT}.{{session_id}}",
            queue="assembler",
            decoder=_raw_body,
            title="session.inspect",
            description="A session's runs, threads and snapshot boundaries (SessionInspection or ErrorReply).",
        )
        async def on_session(body: bytes, session_id: str = Path()) -> NatsResponse:
            try:
                if self._pool is None:
                    raise CtxError("assembler has no store attached")
                reply = await inspect_session(self._pool, session_id)
            except Exception as exc:
                error = _error_reply(exc)
                return NatsResponse(error.model_dump_json().encode(), headers={"ctx-status": "error"})
            return NatsResponse(reply.model_dump_json().encode(), headers={"ctx-status": "ok"})

        @r.subscriber(
            TOOLS_REGISTER,
            queue="assembler",
            decoder=_raw_body,
            title="tools.register",
            description="ToolCatalog in, CatalogRegistered or ErrorReply out: a new catalog revision of a release.",
        )
        async def on_tools(body: bytes) -> NatsResponse:
            try:
                try:
                    catalog = ToolCatalog.model_validate_json(body)
                except ValidationError as exc:
                    first = exc.errors(include_url=False, include_input=False)[0]
                    raise InvalidRequest(f"invalid catalog: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
                if self._pool is None:
                    raise CtxError("assembler has no store attached")
                revision = await register_catalog(self._pool, catalog)
            except Exception as exc:
                error = _error_reply(exc)
                return NatsResponse(error.model_dump_json().encode(), headers={"ctx-status": "error"})
            reply = CatalogRegistered(release=catalog.release, revision=revision)
            return NatsResponse(reply.model_dump_json().encode(), headers={"ctx-status": "ok"})

        @r.subscriber(
            OPERATION_STATUS,
            queue="assembler",
            decoder=_raw_body,
            title="operation.status",
            description="OperationStatusRequest in, Receipt or ErrorReply out.",
        )
        async def on_operation(body: bytes) -> NatsResponse:
            try:
                request = OperationStatusRequest.model_validate_json(body)
                if self._pool is None:
                    raise CtxError("assembler has no store attached")
                receipt = await operation_status(self._pool, request)
            except ValidationError as exc:
                error = InvalidRequest(f"invalid OperationStatusRequest: {exc.errors()[0]['msg']}").to_reply()
                return NatsResponse(error.model_dump_json().encode(), headers={"ctx-status": "error"})
            except Exception as exc:
                error = _error_reply(exc)
                return NatsResponse(error.model_dump_json().encode(), headers={"ctx-status": "error"})
            return NatsResponse(receipt.model_dump_json().encode(), headers={"ctx-status": "ok"})

        @r.subscriber(
            READ,
            queue="assembler",
            decoder=_raw_body,
            title="read",
            description="ReadRequest in, ReadReply or ErrorReply out: a verified range of stored content.",
        )
        async def on_read(body: bytes) -> NatsResponse:
            return await self._read(body)

        @r.subscriber(
            POLICY_REGISTER,
            queue="assembler",
            decoder=_raw_body,
            title="policy.register",
            description="ContextPolicy in, PolicyRegistered or ErrorReply out: a new policy revision.",
        )
        async def on_policy(body: bytes) -> NatsResponse:
            return await self._register_policy(body)

        @r.subscriber(
            "ctx.compacted.{run_id}.{instance_id}",
            decoder=_raw_body,
            title="compacted",
            description="Compactor notices: a thread's view has a new summary (wakes prepares waiting on it).",
        )
        async def on_compacted(body: bytes, run_id: str = Path(), instance_id: str = Path()) -> None:
            self._board.notify(f"{run_id}.{instance_id}")

    async def _prepare(self, body: bytes, run_id: str, instance_id: str) -> NatsResponse:
        started = time.perf_counter()
        purpose = "unknown"
        try:
            request = _parse(PrepareRequest, body)
            purpose = request.purpose.value
            if (request.run_id, request.instance_id) != (run_id, instance_id):
                raise InvalidRequest(
                    f"request for thread {request.run_id}.{request.instance_id} sent on the subject of {run_id}.{instance_id}"
                )
            prepared = await self._require_service().prepare(request)
        except Exception as exc:
            reply = _error_reply(exc)
            self._metrics.prepare_errors.labels(code=reply.code.value).inc()
            if reply.code is ErrorCode.CONTEXT_BUDGET_EXCEEDED:
                reason = "history" if "waited_ms" in reply.details else "required"
                self._metrics.budget_overflows.labels(reason=reason).inc()
                if reason == "history":
                    self._metrics.prepare_compaction_waits.labels(outcome="timed_out").inc()
            return NatsResponse(reply.model_dump_json().encode(), headers={"ctx-status": "error"})
        report = prepared.budget_report
        # The session's policy revision: bounded by registrations, unlike a request's ad-hoc budget.
        m, policy = self._metrics, prepared.policy
        m.prepare_seconds.labels(purpose=purpose, policy=policy).observe(time.perf_counter() - started)
        m.prepare_tokens.labels(purpose=purpose).observe(report.used.total)
        m.prepare_budget_ratio.labels(purpose=purpose).observe(report.used.total / report.input_budget)
        m.prepare_input_tokens.labels(purpose=purpose, policy=policy).observe(report.estimated_input)
        m.prepare_input_budget.labels(purpose=purpose, policy=policy).observe(report.input_budget)
        if report.calibration != "local":
            m.prepare_usage_tokens.labels(purpose=purpose).observe(report.estimated_input)
        for reduction in prepared.reductions:
            m.prepare_reductions.labels(kind=reduction.split(":")[0]).inc()
        if prepared.compaction_wait_ms:
            m.prepare_compaction_waits.labels(outcome="landed").inc()
            m.prepare_compaction_wait_seconds.observe(prepared.compaction_wait_ms / 1000)
        return NatsResponse(prepared.model_dump_json().encode(), headers={"ctx-status": "ok"})

    async def _inspect(self, body: bytes, thread_id: str) -> NatsResponse:
        try:
            request = _parse(InspectRequest, body) if body else InspectRequest()
            inspection = await self._require_service().inspect(thread_id, request)
        except Exception as exc:
            reply = _error_reply(exc)
            return NatsResponse(reply.model_dump_json().encode(), headers={"ctx-status": "error"})
        return NatsResponse(inspection.model_dump_json().encode(), headers={"ctx-status": "ok"})

    async def _read(self, body: bytes) -> NatsResponse:
        try:
            request = _parse(ReadRequest, body)
            if self._pool is None:
                raise CtxError("assembler has no store attached")
            reply = await read_range(self._pool, request)
        except Exception as exc:
            error = _error_reply(exc)
            self._metrics.read_backs.labels(outcome=error.code.value).inc()
            return NatsResponse(error.model_dump_json().encode(), headers={"ctx-status": "error"})
        self._metrics.read_backs.labels(outcome="ok").inc()
        return NatsResponse(reply.model_dump_json().encode(), headers={"ctx-status": "ok"})

    async def _register_policy(self, body: bytes) -> NatsResponse:
        try:
            try:
                policy = ContextPolicy.model_validate_json(body)
            except ValidationError as exc:
                first = exc.errors(include_url=False, include_input=False)[0]
                raise InvalidPolicy(f"invalid policy: {'.'.join(str(p) for p in first['loc']) or 'body'}: {first['msg']}") from None
            policy_budget(policy)
            if self._pool is None:
                raise CtxError("assembler has no store attached")
            async with self._pool.acquire() as conn:
                revision = await PoliciesRepo.register(conn, policy)
        except Exception as exc:
            error = _error_reply(exc)
            return NatsResponse(error.model_dump_json().encode(), headers={"ctx-status": "error"})
        reply = PolicyRegistered(name=policy.name, revision=revision)
        return NatsResponse(reply.model_dump_json().encode(), headers={"ctx-status": "ok"})

    def _require_service(self) -> PrepareService:
        if self._service is None:
            raise CtxError("assembler has no store attached")
        return self._service


_M = TypeVar("_M", PrepareRequest, InspectRequest, ReadRequest)


def _parse(model: type[_M], body: bytes) -> _M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"invalid {model.__name__}: {loc}: {first['msg']}") from None


def _error_reply(exc: Exception) -> ErrorReply:
    if isinstance(exc, CtxError):
        return exc.to_reply()
    log.exception("prepare failed unexpectedly")
    return ErrorReply(code=ErrorCode.INTERNAL, message=f"{type(exc).__name__}: {exc}", retryable=True)
