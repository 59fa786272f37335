"""Request/reply endpoints of branches: fork a session (``ctx.session.fork.<tenant>``), export one
(``ctx.session.export.<tenant>.<session>``). Served by the assembler process beside the queries,
sharing its compute slots and its responder."""

from __future__ import annotations

from collections.abc import Callable

from faststream.nats import NatsResponse, NatsRouter

from contracts.branches import SESSION_EXPORT, SESSION_FORK, ExportRequest, ForkRequest
from services.app.exporting import export_page
from services.app.forking import fork_session
from services.store.postgres import PgStore

from .admission import Admission
from .replies import Inbound, admitted, parse_body, reply_with
from .responder import Responder

__all__ = ["branches_router"]


def branches_router(store: Callable[[], PgStore], admission: Admission, responder: Responder) -> NatsRouter:
    """The router of the fork and export endpoints; ``store`` gives the process's store."""
    router = NatsRouter()

    @responder.endpoint(
        router,
        f"{SESSION_FORK}.{{tenant}}",
        queue="assembler",
        title="session.fork",
        description="ForkRequest in, SessionForked or ErrorReply out: a session branched at a seq.",
    )
    async def on_fork(message: Inbound) -> NatsResponse:
        (tenant,) = message.tokens(1)
        return await admitted(
            admission,
            message.headers,
            lambda _slot: reply_with(
                lambda: fork_session(store(), tenant, parse_body(ForkRequest, message.body))
            ),
        )

    @responder.endpoint(
        router,
        f"{SESSION_EXPORT}.{{tenant}}.{{session_id}}",
        queue="assembler",
        title="session.export",
        description="ExportRequest in, ExportPage or ErrorReply out: a page of the session as a trace.",
    )
    async def on_export(message: Inbound) -> NatsResponse:
        tenant, session_id = message.tokens(2)
        body = message.body
        return await admitted(
            admission,
            message.headers,
            lambda _slot: reply_with(
                lambda: export_page(
                    store(), tenant, session_id, parse_body(ExportRequest, body) if body else ExportRequest()
                )
            ),
        )

    return router
