"""Listening, on a connection of its own, for the commits that change views (ctx_view_changes).

The notices feed a ``ChangeSink`` (``services/app/view_trust.py``). The sink is told the listener is
up only once a notice this connection sent itself came back, so a server path that does not deliver
notices (a pooler in transaction mode) never turns trust on; and it is told the listener is down the
moment the connection is lost, before any reconnection is tried.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from typing import Any, Literal, Protocol

import asyncpg

from services.store.connect import connect

__all__ = [
    "CHANNEL",
    "ChangeSink",
    "ViewChangeListener",
    "calibration_change_of",
    "change_of",
    "head_move_of",
]

CHANNEL = "ctx_view_changes"
_PROBE = "probe:"

log = logging.getLogger("ctxfleet.view_changes")

_Change = tuple[Literal["thread", "session", "run"], str]


class ChangeSink(Protocol):
    """What the listener tells: ``ViewTrust``."""

    def listening(self) -> None: ...
    def deaf(self) -> None: ...
    def changed(self, kind: Literal["thread", "session", "run"], key: str) -> None: ...
    def head_moved(self, thread_id: str, revision: int) -> None: ...
    def calibration_changed(self, tenant: str, profile: str) -> None: ...
    def everything_changed(self) -> None: ...


def head_move_of(payload: str) -> tuple[str, int] | None:
    """``h:<revision>:<thread_id>`` (a thread's head moved to that revision) as
    ``(thread_id, revision)``; ``None`` for any other payload."""
    if not payload.startswith("h:"):
        return None
    revision, _, thread_id = payload[2:].partition(":")
    if not thread_id or not revision.isdigit():
        return None
    return thread_id, int(revision)


def calibration_change_of(payload: str) -> tuple[str, str] | None:
    """``c:["<tenant>","<profile>"]`` (that calibration changed) as ``(tenant,
    profile)``; ``None`` for any other payload."""
    if not payload.startswith("c:"):
        return None
    try:
        key = json.loads(payload[2:])
    except ValueError:
        return None
    match key:
        case [str(tenant), str(profile)]:
            return tenant, profile
        case _:
            return None


def change_of(payload: str) -> _Change | None:
    """What a notice names; ``None`` for one this version does not know (the caller trusts nothing)."""
    prefix, _, key = payload.partition(":")
    if not key:
        return None
    match prefix:
        case "t":
            return ("thread", key)
        case "s":
            return ("session", key)
        case "r":
            return ("run", key)
        case _:
            return None


class ViewChangeListener:
    """One connection LISTENing on ``CHANNEL``; reconnects with backoff while it runs."""

    def __init__(
        self,
        url: str,
        sink: ChangeSink,
        *,
        probe_timeout_s: float = 2.0,
        heartbeat_s: float = 1.0,
        retry_s: tuple[float, float] = (0.5, 5.0),
        **options: Any,
    ) -> None:
        self._url = url
        self._sink = sink
        self._probe_timeout_s = probe_timeout_s
        self._heartbeat_s = heartbeat_s
        self._retry_s = retry_s
        self._options = options
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self._probe: tuple[str, asyncio.Future[None]] | None = None
        self._stopping = False

    @property
    def up(self) -> bool:
        """Whether this listens (notices may still be lost between two heartbeats)."""
        return self._conn is not None and not self._conn.is_closed() and not self._lost.is_set()

    async def start(self) -> None:
        """Listen now if the server allows (else keep trying in the background); never raises."""
        try:
            await self._listen()
        except Exception as exc:  # the fleet serves without trust meanwhile
            log.warning("view changes: not listening yet (%s: %s); retrying", type(exc).__name__, exc)
            await self._close()
        self._task = asyncio.create_task(self._keep_listening(), name="view-changes")

    async def stop(self) -> None:
        """Stop listening; the sink trusts nothing from here on."""
        self._stopping = True
        self._sink.deaf()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._close()

    async def _keep_listening(self) -> None:
        delay = self._retry_s[0]
        while not self._stopping:
            if self.up:
                # A notice is delivered in commit order: the probe's return proves every commit
                # before it was announced here, and a connection gone silent is found within a beat.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._lost.wait(), self._heartbeat_s)
                if self._lost.is_set() or self._stopping:
                    continue
                try:
                    await self._echo()
                except Exception as exc:
                    log.warning("view changes: heartbeat lost (%s: %s)", type(exc).__name__, exc)
                    await self._close()
                continue
            await asyncio.sleep(delay)
            try:
                await self._listen()
                delay = self._retry_s[0]
                log.info("view changes: listening again")
            except Exception as exc:
                log.warning("view changes: reconnect failed (%s: %s)", type(exc).__name__, exc)
                await self._close()
                delay = min(delay * 2, self._retry_s[1])

    async def _listen(self) -> None:
        self._lost.clear()
        conn = await connect(self._url, **self._options)
        self._conn = conn
        conn.add_termination_listener(self._terminated)
        await conn.add_listener(CHANNEL, self._notice)
        await self._echo()
        # Only now: what a load starts from here on is announced to this connection.
        self._sink.listening()

    async def _echo(self) -> None:
        """Send a notice on this connection and wait for it to come back (ConnectionError if not)."""
        conn = self._conn
        if conn is None:
            raise ConnectionError("not connected")
        probe = f"{_PROBE}{uuid.uuid4().hex}"
        arrived: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._probe = (probe, arrived)
        try:
            await asyncio.wait_for(
                conn.execute("SELECT pg_notify($1, $2)", CHANNEL, probe), self._probe_timeout_s
            )
            await asyncio.wait_for(arrived, self._probe_timeout_s)
        except TimeoutError:
            raise ConnectionError("a notice sent on this connection did not come back in time") from None
        finally:
            self._probe = None

    def _notice(self, _conn: object, _pid: int, _channel: str, notice: object) -> None:
        payload = str(notice)
        if payload.startswith(_PROBE):
            if self._probe is not None and self._probe[0] == payload and not self._probe[1].done():
                self._probe[1].set_result(None)
            return
        moved = head_move_of(payload)
        if moved is not None:
            self._sink.head_moved(*moved)
            return
        calibration = calibration_change_of(payload)
        if calibration is not None:
            self._sink.calibration_changed(*calibration)
            return
        change = change_of(payload)
        if change is None:
            self._sink.everything_changed()
        else:
            self._sink.changed(*change)

    def _terminated(self, _conn: object) -> None:
        self._sink.deaf()
        self._lost.set()

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None or conn.is_closed():
            return
        conn.remove_termination_listener(self._terminated)
        self._sink.deaf()
        try:
            await asyncio.wait_for(conn.close(), 2.0)
        except Exception:
            conn.terminate()
