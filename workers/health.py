"""The operations endpoint of a worker process: ``/metrics``, ``/healthz`` and ``/readyz``.

A plain asyncio server on the fleet's own loop, so a blocked loop fails liveness (which is what a
liveness probe is for), and no web framework joins the image for three GET routes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["HealthServer", "Readiness"]

log = logging.getLogger("ctxfleet.http")

# Each check answers ``None`` when fine, or why it is not.
Readiness = Callable[[], Awaitable[Mapping[str, str | None]]]
_READ_LIMIT = 8192
_REQUEST_TIMEOUT_S = 5.0


class HealthServer:
    """Serves the three routes on ``host:port`` until closed."""

    def __init__(self, registry: CollectorRegistry, readiness: Readiness, liveness: Readiness) -> None:
        self._registry = registry
        self._readiness = readiness
        self._liveness = liveness
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (``port`` 0 picks a free one)."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=_READ_LIMIT)
        bound = int(self._server.sockets[0].getsockname()[1])
        log.info("serving /metrics, /healthz, /readyz on %s:%s", host, bound)
        return bound

    async def close(self) -> None:
        """Stop listening (probes then see the process as gone)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = b""
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _REQUEST_TIMEOUT_S)
            method, path = _request_line(request)
            status, content_type, body = await self._route(method, path)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            status, content_type, body = 400, "text/plain", b"bad request\n"
        except Exception as exc:  # an endpoint must answer, never take the worker down
            log.warning("http: %s", exc)
            status, content_type, body = 500, "text/plain", b"internal error\n"
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        try:
            writer.write(head.encode() + (b"" if _is_head(request) else body))
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "text/plain", b"method not allowed\n"
        route = path.split("?", 1)[0]
        if route == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if route == "/healthz":
            checks = dict(await self._liveness())
            if all(v is None for v in checks.values()):
                return 200, "text/plain", b"ok\n"
            return 503, "text/plain", "".join(f"{k}: {v}\n" for k, v in checks.items() if v).encode()
        if route == "/readyz":
            checks = dict(await self._readiness())
            ready = all(v is None for v in checks.values())
            body = json.dumps({"ready": ready, "checks": {k: v or "ok" for k, v in checks.items()}}, indent=1)
            return (200 if ready else 503), "application/json", body.encode() + b"\n"
        return 404, "text/plain", b"not found\n"


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _request_line(request: bytes) -> tuple[str, str]:
    line = request.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise ValueError(f"not an HTTP request line: {line[:80]!r}")
    return parts[0], parts[1]


def _is_head(request: bytes) -> bool:
    return request.startswith(b"HEAD ")
