"""Bringing a fleet up: servers (embedded or external), migrations, streams, workers."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from nats.js.errors import NotFoundError

from contracts import JOBS_STREAM
from services.client import connect_nats
from services.errors import FleetUnavailable, StoreUnavailable
from services.settings import Settings
from services.store.connect import connect as pg_connect
from services.store.migrate import apply_migrations, pending_migrations
from workers.app import Fleet
from workers.compactor import COMPACTOR_DURABLE

from . import MIGRATIONS_DIR
from .embedded import EmbeddedNats, EmbeddedPostgres
from .provision import ProvisionResult, provision_streams

__all__ = [
    "NotProvisioned",
    "SchemaBehind",
    "Servers",
    "migrate",
    "provision",
    "fleet_prerequisites",
    "require_current_schema",
    "serve_workers",
    "start_fleet",
    "start_servers",
]

log = logging.getLogger("ctxfleet")


class SchemaBehind(RuntimeError):
    """The database lacks migrations this build needs."""

    def __init__(self, pending: list[str]) -> None:
        super().__init__(
            f"the database lacks migrations {', '.join(pending)}: run 'ctxfleet migrate' "
            "(in Kubernetes, the migration Job does; workers never migrate or provision on their own)"
        )
        self.pending = pending


class NotProvisioned(RuntimeError):
    """The broker lacks the fleet's streams or the compactor's durable consumer."""

    def __init__(self, cause: str) -> None:
        super().__init__(
            f"the broker lacks the fleet's streams ({cause}): run 'ctxfleet provision' "
            "(in Kubernetes, the migration Job does)"
        )


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
    database_url = settings.database_dsn
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


async def migrate(database_url: str, settings: Settings | None = None, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations."""
    options = settings.database_options() if settings is not None else {}
    conn = await pg_connect(database_url, **options)
    try:
        return await apply_migrations(conn, directory)
    finally:
        await conn.close()


async def require_current_schema(database_url: str, settings: Settings, directory: Path = MIGRATIONS_DIR) -> None:
    """Refuse to serve on a database this build's migrations have not reached (the Job's task, not ours)."""
    conn = await pg_connect(database_url, **settings.database_options())
    try:
        pending = await pending_migrations(conn, directory)
    finally:
        await conn.close()
    if pending:
        raise SchemaBehind(pending)


async def provision(nats_url: str, settings: Settings, *, force: bool = False) -> ProvisionResult:
    """Check the broker and create or reconcile the streams."""
    nc = await connect_nats(nats_url, name="ctxfleet-provision", **settings.nats_options())
    try:
        result = await provision_streams(nc, partitions=settings.partitions, force=force, replicas=settings.stream_replicas)
        log.info("streams: events %s, dead letters %s, jobs %s", result.events, result.dead, result.jobs)
        return result
    finally:
        await nc.close()


async def start_fleet(settings: Settings, servers: Servers) -> Fleet:
    """Migrate, provision and start the configured workers."""
    await migrate(servers.database_url, settings)
    await provision(servers.nats_url, settings)
    fleet = Fleet(settings, nats_url=servers.nats_url, database_url=servers.database_url)
    await fleet.start()
    return fleet


async def fleet_prerequisites(settings: Settings, servers: Servers) -> None:
    """What someone else must have done before these workers can serve: migrations, and provisioning.

    Provisioning is checked where a worker would fail without it (the compactor binds the durable
    consumer that ``ctxfleet provision`` creates last); recorders retry on their own, others need none.
    """
    await require_current_schema(servers.database_url, settings)
    if "compactor" in settings.worker_names:
        nc = await connect_nats(servers.nats_url, name="ctxfleet-startup-check", **settings.nats_options())
        try:
            await nc.jetstream(timeout=5.0).consumer_info(JOBS_STREAM, COMPACTOR_DURABLE)
        except NotFoundError as exc:
            raise NotProvisioned(str(exc)) from None
        finally:
            await nc.close()


async def serve_workers(settings: Settings, servers: Servers) -> Fleet:
    """Start workers on a fleet someone else migrated and provisioned (``ctxfleet worker``, the image).

    Workers run with least privilege: a worker's NATS user cannot create streams, so checking and
    creating them is ``ctxfleet provision``'s job, run once (the k8s Job, Compose's one-shot service).
    With ``CTX_STARTUP_WAIT_S`` the worker waits that long for it (live, not ready) instead of exiting.
    """
    fleet = Fleet(settings, nats_url=servers.nats_url, database_url=servers.database_url)

    async def prerequisites() -> None:
        await fleet_prerequisites(settings, servers)

    try:
        await fleet.start(prerequisites=prerequisites, retry_on=_NOT_YET)
    except NotFoundError as exc:
        await fleet.stop()
        raise NotProvisioned(str(exc)) from None
    except BaseException:
        await fleet.stop()
        raise
    return fleet


# A fresh deployment: the migration Job, PostgreSQL or NATS may simply not be there yet.
_NOT_YET: tuple[type[BaseException], ...] = (SchemaBehind, NotProvisioned, StoreUnavailable, FleetUnavailable)
