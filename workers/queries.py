"""Request/reply endpoints beside prepare: read-back, receipts, sessions, policy and catalog registration.

Served by the assembler process (queue group ``assembler``); each validates its raw body and
answers its typed reply or a typed error.
"""

from __future__ import annotations

import asyncpg
from faststream import Path
from faststream.nats import NatsResponse, NatsRouter

from contracts import (
    OPERATION_STATUS,
    POLICY_REGISTER,
    READ,
    SEARCH,
    SESSION_INSPECT,
    TOOLS_REGISTER,
    CatalogRegistered,
    ContextPolicy,
    OperationStatusRequest,
    PolicyRegistered,
    ReadRequest,
    SearchRequest,
    ToolCatalog,
)
from services.budget import policy_budget
from services.catalogs import register_catalog
from services.errors import CtxError, InvalidPolicy, InvalidRequest
from services.reading import read_range
from services.receipts import operation_status
from services.searching import search
from services.sessions import inspect_session
from services.store.views import PoliciesRepo

from .metrics import FleetMetrics
from .replies import parse_body, raw_body, reply_with

__all__ = ["queries_router"]


def queries_router(pool: asyncpg.Pool | None, metrics: FleetMetrics) -> NatsRouter:
    """The router of the query and registration endpoints, bound to one pool."""
    router = NatsRouter()

    def store() -> asyncpg.Pool:
        if pool is None:
            raise CtxError("this process has no store attached")
        return pool

    @router.subscriber(READ, queue="assembler", decoder=raw_body, title="read",
                       description="ReadRequest in, ReadReply or ErrorReply out: a verified range of stored content.")
    async def on_read(body: bytes) -> NatsResponse:
        response = await reply_with(lambda: read_range(store(), parse_body(ReadRequest, body)))
        metrics.read_backs.labels(outcome=response.headers.get("ctx-status", "error")).inc()
        return response

    @router.subscriber(SEARCH, queue="assembler", decoder=raw_body, title="search",
                       description="SearchRequest in, SearchReply or ErrorReply out: hits within the asking session.")
    async def on_search(body: bytes) -> NatsResponse:
        with metrics.search_seconds.time():
            response = await reply_with(lambda: search(store(), parse_body(SearchRequest, body)))
        metrics.searches.labels(outcome=response.headers.get("ctx-status", "error")).inc()
        return response

    @router.subscriber(OPERATION_STATUS, queue="assembler", decoder=raw_body, title="operation.status",
                       description="OperationStatusRequest in, Receipt or ErrorReply out.")
    async def on_operation(body: bytes) -> NatsResponse:
        return await reply_with(lambda: operation_status(store(), parse_body(OperationStatusRequest, body)))

    @router.subscriber(f"{SESSION_INSPECT}.{{session_id}}", queue="assembler", decoder=raw_body, title="session.inspect",
                       description="A session's runs, threads and snapshot boundaries (SessionInspection or ErrorReply).")
    async def on_session(body: bytes, session_id: str = Path()) -> NatsResponse:
        return await reply_with(lambda: inspect_session(store(), session_id))

    @router.subscriber(POLICY_REGISTER, queue="assembler", decoder=raw_body, title="policy.register",
                       description="ContextPolicy in, PolicyRegistered or ErrorReply out: a new policy revision.")
    async def on_policy(body: bytes) -> NatsResponse:
        async def register() -> PolicyRegistered:
            try:
                policy = parse_body(ContextPolicy, body)
            except InvalidRequest as exc:
                raise InvalidPolicy(exc.message) from None
            policy_budget(policy)
            async with store().acquire() as conn:
                return PolicyRegistered(name=policy.name, revision=await PoliciesRepo.register(conn, policy))

        return await reply_with(register)

    @router.subscriber(TOOLS_REGISTER, queue="assembler", decoder=raw_body, title="tools.register",
                       description="ToolCatalog in, CatalogRegistered or ErrorReply out: a new catalog revision of a release.")
    async def on_tools(body: bytes) -> NatsResponse:
        async def register() -> CatalogRegistered:
            catalog = parse_body(ToolCatalog, body)
            return CatalogRegistered(release=catalog.release, revision=await register_catalog(store(), catalog))

        return await reply_with(register)

    return router
