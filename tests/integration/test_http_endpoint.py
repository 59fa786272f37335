"""The HTTP endpoint on the fleet's loop (``workers.health``): probes, methods, and the console's guard."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry, Counter

from workers.console import console_app, console_url
from workers.health import HealthServer

pytestmark = pytest.mark.anyio


def _call(
    port: int, path: str, method: str = "GET", timeout: float = 2.0, host: str = "127.0.0.1"
) -> tuple[int, str, str]:
    request = urllib.request.Request(f"http://{host}:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.headers.get("content-type", ""), reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("content-type", ""), err.read().decode()


def _checks(**answers: str | None) -> object:
    async def check() -> dict[str, str | None]:
        return dict(answers)

    return check


def _own_address() -> str | None:
    """An address of this machine other than loopback (a UDP connect sends nothing), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") or address == "0.0.0.0" else address


async def _serving(**kwargs: object) -> tuple[HealthServer, int]:
    registry = CollectorRegistry()
    Counter("ctx_probe_total", "a counter the test can find", registry=registry).inc()
    server = HealthServer(
        registry,
        kwargs.get("readiness", _checks(nats=None)),  # type: ignore[arg-type]
        kwargs.get("liveness", _checks(nats=None)),  # type: ignore[arg-type]
        console_app(lambda: None, lambda: None, remote=bool(kwargs.get("remote", False))),
    )
    return server, await server.start(str(kwargs.get("host", "127.0.0.1")), 0)


async def test_probes_and_metrics_answer_as_before_on_the_asgi_server() -> None:
    server, port = await _serving(readiness=_checks(nats=None, postgres="ConnectionError: refused"))
    try:
        assert await asyncio.to_thread(_call, port, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        status, kind, body = await asyncio.to_thread(_call, port, "/readyz")
        assert (status, kind) == (503, "application/json")
        assert '"postgres": "ConnectionError: refused"' in body and '"ready": false' in body
        status, kind, body = await asyncio.to_thread(_call, port, "/metrics")
        assert status == 200 and kind.startswith("text/plain; version=") and "ctx_probe_total 1.0" in body
        assert (await asyncio.to_thread(_call, port, "/healthz", "HEAD"))[::2] == (200, "")
        assert (await asyncio.to_thread(_call, port, "/healthz", "POST"))[0] == 405
        assert (await asyncio.to_thread(_call, port, "/nothing"))[0] == 404
    finally:
        await server.close()


async def test_liveness_names_what_failed_with_503() -> None:
    server, port = await _serving(liveness=_checks(nats="connection closed"))
    try:
        assert await asyncio.to_thread(_call, port, "/healthz") == (
            503,
            "text/plain; charset=utf-8",
            "nats: connection closed\n",
        )
    finally:
        await server.close()


async def test_a_blocked_event_loop_fails_liveness() -> None:
    server, port = await _serving()
    try:
        with ThreadPoolExecutor(1) as prober:
            probe = prober.submit(_call, port, "/healthz", "GET", 0.5)  # sent at once, from its own thread
            time.sleep(1.0)  # noqa: ASYNC251  # the point: the loop that would answer it is stuck
            with pytest.raises((TimeoutError, urllib.error.URLError)):
                probe.result()
        assert (await asyncio.to_thread(_call, port, "/healthz"))[0] == 200  # and answers once it is not
    finally:
        await server.close()


async def test_a_taken_port_is_an_os_error_and_close_frees_the_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            await HealthServer(CollectorRegistry(), _checks(), _checks()).start("127.0.0.1", port)  # type: ignore[arg-type]
    server, port = await _serving()
    await server.close()
    with pytest.raises(OSError):  # nothing listens any more
        await asyncio.to_thread(_call, port, "/healthz", "GET", 0.5)


async def test_the_console_says_it_is_starting_until_the_process_has_a_store() -> None:
    server, port = await _serving()
    try:
        status, kind, body = await asyncio.to_thread(_call, port, "/console/")
        assert (status, kind) == (503, "text/html; charset=utf-8")
        assert "the fleet is not connected yet" in body
        assert (await asyncio.to_thread(_call, port, "/console"))[0] == 503  # redirected to /console/
    finally:
        await server.close()


@pytest.mark.parametrize("remote", [False, True])
async def test_the_console_answers_other_machines_only_when_told_to(remote: bool) -> None:
    address = _own_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    server, port = await _serving(host="0.0.0.0", remote=remote)
    try:
        status, _, body = await asyncio.to_thread(_call, port, "/console/", "GET", 2.0, address)
        assert status == (503 if remote else 403)
        assert remote or "CTX_CONSOLE_REMOTE=true" in body
        assert (await asyncio.to_thread(_call, port, "/console/"))[0] == 503  # this machine: always
        assert (await asyncio.to_thread(_call, port, "/healthz", "GET", 2.0, address))[0] == 200  # probes
    finally:
        await server.close()


def test_the_console_url_is_one_a_browser_on_this_machine_opens() -> None:
    assert console_url("127.0.0.1", 9464) == "http://127.0.0.1:9464/console/"
    assert console_url("0.0.0.0", 9464) == "http://127.0.0.1:9464/console/"
    assert console_url("::", 80) == "http://[::1]:80/console/"
    assert console_url("127.0.0.1", 0).startswith("not served")
