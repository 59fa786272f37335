"""Bringing a fleet up: servers (embedded or external), migrations, streams, workers."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import nats

from services.settings import Settings
from services.store.migrate import apply_migrations
from workers.app import Fleet

from . import MIGRATIONS_DIR
from .embedded import EmbeddedNats, EmbeddedPostgres
from .provision import provision_streams

__all__ = [
    "Servers",
    "migrate",
    "provision",
    "start_fleet",
    "start_servers",
]

log = logging.getLogger("ctxfleet")


@dataclass
class Servers:
    """The NATS and Postgres this process uses, and the embedded ones it owns (if any)."""

    nats_url: str
    database_url: str
    owned: list[EmbeddedNats | EmbeddedPostgres] = field(default_factory=list)

    def stop(self) -> None:
        """Stop the embedded servers this process started."""
        for server in reversed(self.owned):
            server.stop()
        self.owned.clear()


def start_servers(settings: Settings) -> Servers:
    """External servers where ``CTX_*_URL`` is set, embedded ones under the data folder otherwise."""
    owned: list[EmbeddedNats | EmbeddedPostgres] = []
    nats_url = settings.nats_url
    database_url = settings.database_url
    try:
        if database_url is None:
            pg = EmbeddedPostgres(settings.data_dir / "postgres")
            database_url = pg.start()
            owned.append(pg)
        if nats_url is None:
            broker = EmbeddedNats(settings.data_dir / "nats", max_payload=settings.nats_max_payload)
            nats_url = broker.start()
            owned.append(broker)
    except Exception:
        for server in reversed(owned):
            server.stop()
        raise
    return Servers(nats_url=nats_url, database_url=database_url, owned=owned)


async def migrate(database_url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations."""
    conn = await asyncpg.connect(database_url)
    try:
        return await apply_migrations(conn, directory)
    finally:
        await conn.close()


async def provision(nats_url: str, settings: Settings, *, force: bool = False) -> None:
    """Check the broker and create or reconcile the streams."""
    nc = await nats.connect(nats_url, name="ctxfleet-provision")
    try:
        result = await provision_streams(nc, partitions=settings.partitions, force=force)
        log.info("streams: events %s, dead letters %s", result.events, result.dead)
    finally:
        await nc.close()


async def start_fleet(settings: Settings, servers: Servers) -> Fleet:
    """Migrate, provision and start the configured workers."""
    await migrate(servers.database_url)
    await provision(servers.nats_url, settings)
    fleet = Fleet(settings, nats_url=servers.nats_url, database_url=servers.database_url)
    await fleet.start()
    return fleet
