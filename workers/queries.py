"""Request/reply endpoints beside prepare: read-back, receipts, sessions, policy and catalog registration.

Served by the assembler process (queue group ``assembler``); each validates its raw body and
answers its typed reply or a typed error. They share the process's compute slots with prepare.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream.nats import NatsResponse, NatsRouter
from pydantic import BaseModel

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
from services.core.budget import policy_budget
from contracts.hooks import HOOKS_REGISTER, HookSet, HooksRegistered, hook_subject_tenant
from services.app.catalogs import register_catalog
from contracts.exceptions import CtxError, InvalidPolicy, InvalidRequest
from services.app.reading import read_range
from services.app.receipts import operation_status
from services.app.searching import search
from services.app.sessions import inspect_session
from services.store.postgres import PgStore

from .admission import Admission
from .branches import branches_router
from .metrics import FleetMetrics
from .replies import Inbound, admitted, parse_body, reply_with
from .responder import Responder

__all__ = ["queries_router"]


def queries_router(
    attached: PgStore | None, metrics: FleetMetrics, admission: Admission, responder: Responder
) -> NatsRouter:
    """The router of the query and registration endpoints, bound to one store, one admission and the
    process's responder."""
    router = NatsRouter()

    async def serve(message: Inbound, run: Callable[[], Awaitable[BaseModel]]) -> NatsResponse:
        return await admitted(admission, message.headers, lambda _slot: reply_with(run))

    def store() -> PgStore:
        if attached is None:
            raise CtxError("this process has no store attached")
        return attached

    # Every endpoint's subject ends in the asking tenant (``{tenant}``):
    # the server's permissions vouch for it.
    @responder.endpoint(
        router,
        f"{READ}.{{tenant}}",
        queue="assembler",
        title="read",
        description="ReadRequest in, ReadReply or ErrorReply out: a verified range of stored content.",
    )
    async def on_read(message: Inbound) -> NatsResponse:
        (tenant,) = message.tokens(1)
        response = await serve(
            message, lambda: read_range(store(), parse_body(ReadRequest, message.body), tenant=tenant)
        )
        metrics.read_backs.labels(outcome=response.headers.get("ctx-status", "error")).inc()
        return response

    @responder.endpoint(
        router,
        f"{SEARCH}.{{tenant}}",
        queue="assembler",
        title="search",
        description="SearchRequest in, SearchReply or ErrorReply out: hits within the asking session.",
    )
    async def on_search(message: Inbound) -> NatsResponse:
        (tenant,) = message.tokens(1)
        with metrics.search_seconds.time():
            response = await serve(
                message, lambda: search(store(), parse_body(SearchRequest, message.body), tenant=tenant)
            )
        metrics.searches.labels(outcome=response.headers.get("ctx-status", "error")).inc()
        return response

    @responder.endpoint(
        router,
        f"{OPERATION_STATUS}.{{tenant}}",
        queue="assembler",
        title="operation.status",
        description="OperationStatusRequest in, Receipt or ErrorReply out.",
    )
    async def on_operation(message: Inbound) -> NatsResponse:
        (tenant,) = message.tokens(1)
        return await serve(
            message,
            lambda: operation_status(
                store(), parse_body(OperationStatusRequest, message.body), tenant=tenant
            ),
        )

    @responder.endpoint(
        router,
        f"{SESSION_INSPECT}.{{tenant}}.{{session_id}}",
        queue="assembler",
        title="session.inspect",
        description="A session's runs, threads and snapshot boundaries (SessionInspection or ErrorReply).",
    )
    async def on_session(message: Inbound) -> NatsResponse:
        tenant, session_id = message.tokens(2)
        return await serve(message, lambda: inspect_session(store(), tenant, session_id))

    @responder.endpoint(
        router,
        f"{POLICY_REGISTER}.{{tenant}}",
        queue="assembler",
        title="policy.register",
        description="ContextPolicy in, PolicyRegistered or ErrorReply out: a new policy revision.",
    )
    async def on_policy(message: Inbound) -> NatsResponse:
        (tenant,) = message.tokens(1)

        async def register() -> PolicyRegistered:
            try:
                policy = parse_body(ContextPolicy, message.body)
            except InvalidRequest as exc:
                raise InvalidPolicy(exc.message) from None
            policy_budget(policy)
            return PolicyRegistered(name=policy.name, revision=await store().register_policy(tenant, policy))

        return await serve(message, register)

    @responder.endpoint(
        router,
        f"{TOOLS_REGISTER}.{{tenant}}",
        queue="assembler",
        title="tools.register",
        description=(
            "ToolCatalog in, CatalogRegistered or ErrorReply out: a new catalog revision of a release."
        ),
    )
    async def on_tools(message: Inbound) -> NatsResponse:
        (tenant,) = message.tokens(1)

        async def register() -> CatalogRegistered:
            catalog = parse_body(ToolCatalog, message.body)
            return CatalogRegistered(
                release=catalog.release, revision=await register_catalog(store(), tenant, catalog)
            )

        return await serve(message, register)

    @responder.endpoint(
        router,
        f"{HOOKS_REGISTER}.{{tenant}}",
        queue="assembler",
        title="hooks.register",
        description="HookSet in, HooksRegistered or ErrorReply out: a new hook set revision of a release.",
    )
    async def on_hooks(message: Inbound) -> NatsResponse:
        (tenant,) = message.tokens(1)

        async def register() -> HooksRegistered:
            hooks = parse_body(HookSet, message.body)
            foreign = sorted({h.subject for h in hooks.hooks if hook_subject_tenant(h.subject) != tenant})
            if foreign:
                raise InvalidRequest(
                    f"hook subjects must be under hooks.{tenant}. (the registering tenant's): "
                    + ", ".join(foreign)
                )
            return HooksRegistered(
                release=hooks.release, revision=await store().register_hooks(tenant, hooks)
            )

        return await serve(message, register)

    router.include_router(branches_router(store, admission, responder))
    return router
