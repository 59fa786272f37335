"""Keeping the embedded servers of ``ctxfleet up`` alive while it serves.

A server that exits is restarted on the same address (NATS port, PostgreSQL socket), so the
workers reconnect on their own: our NATS connections retry for ever, and the asyncpg pool drops a
connection the server closed and opens a new one on the next acquire. Restarts are bounded: past
``restarts`` within ``RESTART_WINDOW_S`` (a server that keeps dying has a cause a restart will not
fix: a full disk, a damaged store), or when a restart itself fails, supervision ends with
``ServerDied``, which names the server and its log, and the caller stops the fleet.

A server that runs is tended meanwhile (``tend``): the embedded nats-server keeps its store's
limit within the disk's room, and asks for a restart when its store stopped taking writes (a full
or read-only disk) and takes them again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, Protocol

from .embedded import EmbeddedServerError

__all__ = ["CHECK_INTERVAL_S", "RESTART_WINDOW_S", "ServerDied", "SupervisedServer", "supervise"]

log = logging.getLogger("ctxfleet")
RESTART_WINDOW_S = 600.0
# How often `ctxfleet up` looks at its servers: a check is cheap (is the process there, is its store
# writable), and twice a second restarts one before its clients' reconnect attempts give up.
CHECK_INTERVAL_S = 0.5


class SupervisedServer(Protocol):
    """What supervision needs of an embedded server."""

    @property
    def name(self) -> str:
        """``nats-server`` or ``postgres``."""
        ...

    @property
    def log_path(self) -> Path:
        """Where its log is."""
        ...

    def is_running(self) -> bool:
        """Whether its process is alive."""
        ...

    def exit_status(self) -> str:
        """How it ended."""
        ...

    def restart(self, timeout: float = 15.0) -> str:
        """Start it again on the same address."""
        ...

    def tend(self) -> str | None:
        """Upkeep while it runs (blocking, run in a thread); a reason to restart it, or ``None``."""
        ...


class ServerDied(EmbeddedServerError):
    """An embedded server exited and is not being restarted."""

    def __init__(self, name: str, status: str, log_path: Path, why: str) -> None:
        super().__init__(f"{name} {status} and {why}; the fleet stopped. Its log: {log_path}")
        self.name = name
        self.log_path = log_path


async def supervise(
    servers: Sequence[SupervisedServer],
    *,
    restarts: int,
    interval_s: float = CHECK_INTERVAL_S,
    on_restart: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
) -> NoReturn:
    """Watch ``servers`` every ``interval_s``; restart one that exited, up to ``restarts`` per window.

    ``on_restart`` runs after each successful restart (to write the new PID down).

    Raises:
        ServerDied: a server exited past its restart budget, or could not be restarted.
    """
    recent: dict[str, deque[float]] = {s.name: deque() for s in servers}
    while True:
        await asyncio.sleep(interval_s)
        for server in servers:
            if server.is_running():
                # A server that runs may still need a restart: a store that met a full disk.
                why = await asyncio.to_thread(server.tend)
                if why is None:
                    continue
                status = why
            else:
                status = server.exit_status()
            now = clock()
            history = recent[server.name]
            while history and now - history[0] > RESTART_WINDOW_S:
                history.popleft()
            if len(history) >= restarts:
                why = (
                    "restarts are off (CTX_SERVER_RESTARTS=0)"
                    if restarts == 0
                    else (
                        f"was restarted {len(history)} times in the last {RESTART_WINDOW_S / 60:.0f} "
                        "minutes already"
                    )
                )
                raise ServerDied(server.name, status, server.log_path, why)
            history.append(now)
            log.warning(
                "%s %s; restarting it on the same address (%d of %d)",
                server.name,
                status,
                len(history),
                restarts,
            )
            started = clock()
            try:
                # pg_ctl and the wait for the port block; the loop keeps serving meanwhile.
                await asyncio.to_thread(server.restart)
            except EmbeddedServerError as exc:
                raise ServerDied(
                    server.name, status, server.log_path, f"could not be restarted ({exc})"
                ) from exc
            on_restart()
            log.warning("%s restarted in %.2fs", server.name, clock() - started)
