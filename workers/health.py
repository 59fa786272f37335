"""The HTTP endpoint of a worker process: ``/metrics``, ``/healthz``, ``/readyz`` and the console.

A Starlette app served by uvicorn on the fleet's own event loop, not in a thread: a blocked loop
answers nothing, so liveness fails, which is what a liveness probe is for. The socket is bound here
(a taken port is an ``OSError`` the caller turns into a configuration error, where uvicorn would
exit the process), and the fleet keeps its own signal handlers (uvicorn's would swallow SIGTERM).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Awaitable, Callable, Generator, Mapping

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp

__all__ = ["HealthServer", "Readiness", "operations_app"]

log = logging.getLogger("ctxfleet.http")

# Each check answers ``None`` when fine, or why it is not.
Readiness = Callable[[], Awaitable[Mapping[str, str | None]]]
# A request still open when the server stops gets this long to finish (a probe or a console page).
_GRACEFUL_S = 2.0
_STARTED_POLL_S = 0.01


def operations_app(
    registry: CollectorRegistry, readiness: Readiness, liveness: Readiness, console: ASGIApp | None = None
) -> Starlette:
    """The three operations routes, and the console under ``/console/`` when given one."""

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def healthz(_: Request) -> Response:
        checks = dict(await liveness())
        if all(v is None for v in checks.values()):
            return PlainTextResponse("ok\n")
        return PlainTextResponse("".join(f"{k}: {v}\n" for k, v in checks.items() if v), status_code=503)

    async def readyz(_: Request) -> Response:
        checks = dict(await readiness())
        ready = all(v is None for v in checks.values())
        body = json.dumps({"ready": ready, "checks": {k: v or "ok" for k, v in checks.items()}}, indent=1)
        return Response(body + "\n", status_code=200 if ready else 503, media_type="application/json")

    routes: list[BaseRoute] = [
        Route("/metrics", metrics),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
    ]
    if console is not None:

        async def to_console(_: Request) -> Response:
            return RedirectResponse("/console/")

        routes += [Route("/console", to_console), Mount("/console", app=console)]
    return Starlette(routes=routes)


class _LoopServer(uvicorn.Server):
    """uvicorn without its signal handlers: the process that embeds it decides when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class HealthServer:
    """Serves :func:`operations_app` on ``host:port`` until closed."""

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Readiness,
        liveness: Readiness,
        console: ASGIApp | None = None,
    ) -> None:
        self._app = operations_app(registry, readiness, liveness, console)
        self._server: _LoopServer | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (``port`` 0 picks a free one). ``OSError`` if it cannot."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        bound = int(sock.getsockname()[1])
        config = uvicorn.Config(
            self._app,
            loop="none",
            lifespan="off",
            log_config=None,
            # Its start and stop lines would repeat ours at INFO; what goes wrong still reaches the log.
            log_level="warning",
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=int(_GRACEFUL_S),
        )
        server = self._server = _LoopServer(config)
        self._task = asyncio.create_task(server.serve(sockets=[sock]), name="ctxfleet-http")
        while not server.started:
            if self._task.done():  # failed in startup: say why rather than wait forever
                sock.close()
                self._task.result()
                raise OSError(f"the HTTP server on {host}:{bound} stopped while starting")
            await asyncio.sleep(_STARTED_POLL_S)
        log.info("serving /metrics, /healthz, /readyz and /console/ on %s:%s", host, bound)
        return bound

    async def close(self) -> None:
        """Stop listening (probes then see the process as gone)."""
        server, task = self._server, self._task
        self._server = self._task = None
        if server is None or task is None:
            return
        server.should_exit = True
        await asyncio.wait({task}, timeout=_GRACEFUL_S + 1.0)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
