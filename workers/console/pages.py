"""The console's routes: sessions → runs → threads, a thread's timeline, its prepared context, search,
the contexts it was served (a chart, each step as the model saw it and its diff), its compactions.

GET only, HTML rendered on the server from the package's Jinja2 templates with autoescaping on:
record content is whatever an agent or a tool wrote, so it is never markup here. The store comes
from the process (``source``), which has none while it is still connecting: a page then says so.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from contracts.ids import is_identifier
from services.app.preparing import PrepareService
from services.app.sessions import inspect_session
from contracts.exceptions import CtxError, StoreUnavailable, ThreadNotFound

from .reading import (
    ConsoleStore,
    prepare_context,
    read_compaction,
    read_search,
    read_served,
    read_served_step,
    read_sessions,
    read_thread,
)

__all__ = ["ShowingSource", "StoreSource", "console_app", "console_url", "local_url"]

# The store of the running process, or ``None`` while it starts (or after it stopped).
StoreSource = Callable[[], ConsoleStore | None]
# The process's prepares (its hooks, its calibration), or ``None`` while it starts.
ShowingSource = Callable[[], PrepareService | None]
_Page = Callable[[Request, ConsoleStore], Awaitable[Response]]

# A block's text on the context page is cut here, its full length stated: a tool output can be megabytes.
_TEXT_CHARS = 4_000

_templates = jinja2.Environment(
    loader=jinja2.PackageLoader("workers.console", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def _tenant(request: Request) -> str | None:
    tenant = request.query_params.get("tenant", "").strip()
    return tenant or None


def _render(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    base = str(request.scope.get("root_path", "")).rstrip("/")
    html = _templates.get_template(template).render(base=base, tenant=_tenant(request), **context)
    return HTMLResponse(html, status_code=status)


def _from_this_machine(request: Request) -> bool:
    try:
        return request.client is not None and ipaddress.ip_address(request.client.host).is_loopback
    except ValueError:  # not an IP address (a test transport, a unix socket): not known to be local
        return False


def _guarded(source: StoreSource, page: _Page, *, remote: bool) -> Callable[[Request], Awaitable[Response]]:
    """A page with the store in hand; a typed error becomes a page that says what went wrong."""

    async def endpoint(request: Request) -> Response:
        if not remote and not _from_this_machine(request):
            message = "the console answers only on this machine (a tunnel, or CTX_CONSOLE_REMOTE=true)"
            return _render(request, "error.html", 403, code="forbidden", message=message)
        store = source()
        if store is None:
            return _render(
                request, "error.html", 503, code="starting", message="the fleet is not connected yet"
            )
        try:
            return await page(request, store)
        except CtxError as exc:
            status = (
                404 if isinstance(exc, ThreadNotFound) else 503 if isinstance(exc, StoreUnavailable) else 400
            )
            return _render(request, "error.html", status, code=exc.code.value, message=exc.message)

    return endpoint


async def _sessions(request: Request, store: ConsoleStore) -> Response:
    sessions = await read_sessions(store, _tenant(request))
    return _render(request, "sessions.html", sessions=sessions)


def _session_tenant(request: Request) -> str:
    # A session's own page needs its tenant (the sessions list links with it); none named: the default.
    return _tenant(request) or "default"


def _session_id(request: Request) -> str:
    session_id = str(request.path_params["session_id"])
    if not is_identifier(session_id):
        raise ThreadNotFound(f"session {session_id}")
    return session_id


async def _session(request: Request, store: ConsoleStore) -> Response:
    session_id = _session_id(request)
    session = await inspect_session(store, _session_tenant(request), session_id)
    return _render(request, "session.html", session=session, session_tenant=_session_tenant(request))


async def _search(request: Request, store: ConsoleStore) -> Response:
    session_id = _session_id(request)
    query = request.query_params.get("q", "").strip()[:500]
    reply = await read_search(store, _session_tenant(request), session_id, query) if query else None
    return _render(
        request,
        "search.html",
        session_id=session_id,
        session_tenant=_session_tenant(request),
        query=query,
        hits=() if reply is None else reply.hits,
    )


def _thread_id(request: Request) -> str:
    thread_id = str(request.path_params["thread_id"])
    run_id, _, instance_id = thread_id.partition(".")
    if not (is_identifier(run_id) and is_identifier(instance_id)):
        raise ThreadNotFound(thread_id)
    return thread_id


async def _thread(request: Request, store: ConsoleStore) -> Response:
    page = await read_thread(store, _thread_id(request), _tenant(request))
    return _render(request, "thread.html", page=page, thread=page.inspection)


def _context(showing: ShowingSource) -> _Page:
    async def page(request: Request, store: ConsoleStore) -> Response:
        service = showing()
        if service is None:
            return _render(
                request, "error.html", 503, code="starting", message="the fleet is not connected yet"
            )
        shown = await prepare_context(store, service, _thread_id(request), _tenant(request))
        return _render(request, "context.html", page=shown, prepared=shown.prepared, text_chars=_TEXT_CHARS)

    return page


async def _served(request: Request, store: ConsoleStore) -> Response:
    page = await read_served(store, _thread_id(request), _tenant(request))
    return _render(request, "served.html", page=page)


async def _served_step(request: Request, store: ConsoleStore) -> Response:
    step = int(request.path_params["step"])
    page = await read_served_step(store, _thread_id(request), step, _tenant(request))
    return _render(request, "served_step.html", page=page, served=page.step.served)


async def _compaction(request: Request, store: ConsoleStore) -> Response:
    revision = int(request.path_params["view_revision"])
    page = await read_compaction(store, _thread_id(request), revision, _tenant(request))
    return _render(request, "compaction.html", page=page, c=page.compaction)


def console_app(source: StoreSource, showing: ShowingSource, *, remote: bool = False) -> Starlette:
    """The console as an ASGI app, to mount under ``/console``; ``remote``: answer other machines too.

    ``showing``: the prepares a context page is shown by, the ones ``ctxfleet context`` is."""
    pages: list[tuple[str, _Page]] = [
        ("/", _sessions),
        ("/sessions/{session_id}", _session),
        ("/sessions/{session_id}/search", _search),
        ("/threads/{thread_id}", _thread),
        ("/threads/{thread_id}/context", _context(showing)),
        ("/threads/{thread_id}/served", _served),
        ("/threads/{thread_id}/served/{step:int}", _served_step),
        ("/threads/{thread_id}/compactions/{view_revision:int}", _compaction),
    ]
    return Starlette(routes=[Route(path, _guarded(source, page, remote=remote)) for path, page in pages])


def console_url(host: str, port: int | None) -> str:
    """Where a person on this machine opens the console served on ``host:port``."""
    return local_url(host, port, "/console/") if port else "not served (CTX_HTTP_PORT=0)"


def local_url(host: str, port: int, path: str) -> str:
    """Where a person on this machine opens ``path`` of the routes served on ``host:port`` (``/metrics``)."""
    shown = "127.0.0.1" if host in ("", "0.0.0.0") else "[::1]" if host == "::" else host
    return f"http://{f'[{shown}]' if ':' in shown and not shown.startswith('[') else shown}:{port}{path}"
