"""Process and server control for the chaos suite: the servers it owns, and a store that rides outages.

The suite starts its own nats-server and PostgreSQL (never the session's, never a system service),
on loopback and a unix socket, so it can kill and restart them. Their data stays on disk across a
restart; that durability is what the scenarios test. Workers run as ``ctxfleet worker`` processes
(``tests.fixtures.processes``), so a SIGKILL takes nothing but what a real crash takes.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from infra.embedded import EmbeddedNats, EmbeddedPostgres
from infra.runtime import migrate
from tests.fixtures.servers import kill_postgres, with_database

__all__ = ["Stack", "Store"]

_TEMPLATE = "ctx_chaos_template"


class Stack:
    """A nats-server (JetStream on disk) and a PostgreSQL cluster that the suite may kill."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="ctx-chaos-servers-"))
        self.root.chmod(0o755)  # embedded PostgreSQL runs as its own user when we are root
        self.nats = EmbeddedNats(self.root / "nats")
        self.pg = EmbeddedPostgres(self.root / "pg")
        self.pg_url = ""

    @property
    def nats_url(self) -> str:
        """Where clients and workers connect; the port stays the same across restarts."""
        return self.nats.url

    def start(self) -> None:
        """Start both servers and migrate the template every scenario's database is copied from."""
        self.nats.start()
        self.pg_url = self.pg.start()
        asyncio.run(self._build_template())
        # The recorder's commits do not wait for the WAL flush; a WAL writer that
        # flushes them only every 10 s makes each SIGKILL lose the last of them, which the recorder
        # must then read again from the broker, every event once and in order.
        asyncio.run(self._admin("ALTER SYSTEM SET wal_writer_delay = '10s'"))
        asyncio.run(self._admin("SELECT pg_reload_conf()"))

    def stop(self) -> None:
        """Stop both servers; their data stays under ``root``."""
        self.nats.stop()
        self.pg.stop()

    def close(self) -> None:
        """Stop both servers and delete their data."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    async def new_database(self) -> str:
        """A fresh, migrated database for one scenario."""
        name = f"ctx_chaos_{uuid.uuid4().hex[:10]}"
        await self._admin(f"CREATE DATABASE {name} TEMPLATE {_TEMPLATE}")
        return with_database(self.pg_url, name)

    async def drop_database(self, url: str) -> None:
        """Drop a scenario's database (connections and all)."""
        await self._admin(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1].split('?')[0]} WITH (FORCE)")

    def kill_nats(self) -> None:
        """SIGKILL nats-server: what it had not written to its store is gone."""
        proc = self.nats.process
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def stop_nats(self) -> None:
        """A clean nats-server stop (SIGTERM)."""
        self.nats.stop()

    def start_nats(self) -> None:
        """Start nats-server again on the same port and store."""
        self.nats.start()

    def kill_postgres(self) -> None:
        """SIGKILL the postmaster and every backend: the next start runs crash recovery from the WAL."""
        kill_postgres(self.pg)

    def stop_postgres(self) -> None:
        """A fast PostgreSQL shutdown (clients are disconnected, the WAL is flushed)."""
        self.pg.stop()

    def start_postgres(self) -> None:
        """Start PostgreSQL again on the same data and socket (the URL does not change)."""
        # restart() waits out a killed postmaster's backends and its stale lock files.
        assert self.pg.restart() == self.pg_url

    async def _build_template(self) -> None:
        await self._admin(f"DROP DATABASE IF EXISTS {_TEMPLATE}")
        await self._admin(f"CREATE DATABASE {_TEMPLATE}")
        await migrate(with_database(self.pg_url, _TEMPLATE))

    async def _admin(self, sql: str) -> None:
        conn = await asyncpg.connect(self.pg_url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()


class Store:
    """The scenario's database as the harness reads it: one connection, reopened after an outage."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: asyncpg.Connection | None = None

    async def connection(self) -> asyncpg.Connection:
        """An open connection (raises while PostgreSQL is down)."""
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self.url, timeout=5)
        return self._conn

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record] | None:
        """Rows, or ``None`` while the database cannot answer (an outage being ridden out)."""
        try:
            conn = await self.connection()
            return list(await conn.fetch(sql, *args, timeout=5))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            await self._drop()
            return None

    async def close(self) -> None:
        """Close the connection."""
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
