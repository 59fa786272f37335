"""Request/reply endpoints beside prepare: read-back, receipts, sessions, branches, policy and catalog
registration.

Served by the assembler process (queue group ``assembler``); each validates its raw body and
answers its typed reply or a typed error. They share the process's compute slots with prepare.
Every endpoint's subject starts with the asking tenant (``{tenant}``): the server's permissions vouch
for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import nullcontext

from faststream.nats import NatsResponse, NatsRouter
from prometheus_client import Counter, Histogram
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
from contracts.branches import SESSION_EXPORT, SESSION_FORK, ExportRequest, ForkRequest
from contracts.exceptions import CtxError, InvalidPolicy, InvalidRequest
from contracts.hooks import HOOKS_REGISTER, HookSet, HooksRegistered, hook_subject_tenant
from services.app.catalogs import register_catalog
from services.app.exporting import export_page
from services.app.forking import fork_session
from services.app.reading import read_range
from services.app.receipts import operation_status
from services.app.searching import search
from services.app.sessions import inspect_session
from services.core.budget import policy_budget
from services.store.postgres import PgStore

from .admission import Admission
from .metrics import FleetMetrics
from .replies import Inbound, admitted, parse_body, reply_with
from .responder import Responder

__all__ = ["queries_router"]

# What answers a request: the store, the raw body, and the subject's tokens from ``{tenant}`` on.
_Answer = Callable[[PgStore, bytes, list[str]], Awaitable[BaseModel]]


def queries_router(
    attached: PgStore | None, metrics: FleetMetrics, admission: Admission, responder: Responder
) -> NatsRouter:
    """The router of the query and registration endpoints, bound to one store, one admission and the
    process's responder."""
    router = NatsRouter()

    def store() -> PgStore:
        if attached is None:
            raise CtxError("this process has no store attached")
        return attached

    def serve(
        subject: str,
        title: str,
        answer: _Answer,
        *,
        outcomes: Counter | None = None,
        seconds: Histogram | None = None,
    ) -> None:
        @responder.endpoint(router, subject, queue="assembler", title=title)
        async def on_request(message: Inbound) -> NatsResponse:
            tokens = message.tokens(subject.count("{"))
            with seconds.time() if seconds is not None else nullcontext():
                response = await admitted(
                    admission,
                    message.headers,
                    lambda _slot: reply_with(lambda: answer(store(), message.body, tokens)),
                )
            if outcomes is not None:
                outcomes.labels(outcome=response.headers.get("ctx-status", "error")).inc()
            return response

    serve(
        f"{READ}.{{tenant}}",
        "read",
        lambda s, body, t: read_range(s, parse_body(ReadRequest, body), tenant=t[0]),
        outcomes=metrics.read_backs,
    )
    serve(
        f"{SEARCH}.{{tenant}}",
        "search",
        lambda s, body, t: search(s, parse_body(SearchRequest, body), tenant=t[0]),
        outcomes=metrics.searches,
        seconds=metrics.search_seconds,
    )
    serve(
        f"{OPERATION_STATUS}.{{tenant}}",
        "operation.status",
        lambda s, body, t: operation_status(s, parse_body(OperationStatusRequest, body), tenant=t[0]),
    )
    serve(
        f"{SESSION_INSPECT}.{{tenant}}.{{session_id}}",
        "session.inspect",
        lambda s, _body, t: inspect_session(s, t[0], t[1]),
    )
    serve(f"{POLICY_REGISTER}.{{tenant}}", "policy.register", _register_policy)
    serve(f"{TOOLS_REGISTER}.{{tenant}}", "tools.register", _register_tools)
    serve(f"{HOOKS_REGISTER}.{{tenant}}", "hooks.register", _register_hooks)
    serve(
        f"{SESSION_FORK}.{{tenant}}",
        "session.fork",
        lambda s, body, t: fork_session(s, t[0], parse_body(ForkRequest, body)),
    )
    serve(
        f"{SESSION_EXPORT}.{{tenant}}.{{session_id}}",
        "session.export",
        lambda s, body, t: export_page(
            s, t[0], t[1], parse_body(ExportRequest, body) if body else ExportRequest()
        ),
    )
    return router


async def _register_policy(store: PgStore, body: bytes, tokens: list[str]) -> PolicyRegistered:
    try:
        policy = parse_body(ContextPolicy, body)
    except InvalidRequest as exc:
        raise InvalidPolicy(exc.message) from None
    policy_budget(policy)
    return PolicyRegistered(name=policy.name, revision=await store.register_policy(tokens[0], policy))


async def _register_tools(store: PgStore, body: bytes, tokens: list[str]) -> CatalogRegistered:
    catalog = parse_body(ToolCatalog, body)
    return CatalogRegistered(
        release=catalog.release, revision=await register_catalog(store, tokens[0], catalog)
    )


async def _register_hooks(store: PgStore, body: bytes, tokens: list[str]) -> HooksRegistered:
    tenant = tokens[0]
    hooks = parse_body(HookSet, body)
    foreign = sorted({h.subject for h in hooks.hooks if hook_subject_tenant(h.subject) != tenant})
    if foreign:
        raise InvalidRequest(
            f"hook subjects must be under hooks.{tenant}. (the registering tenant's): " + ", ".join(foreign)
        )
    return HooksRegistered(release=hooks.release, revision=await store.register_hooks(tenant, hooks))
