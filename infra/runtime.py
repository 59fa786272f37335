"""Bringing a fleet up: servers (embedded or external), migrations, streams, workers."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NoReturn

from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import NotFoundError

from contracts import JOBS_STREAM
from ctxfleet_client.client import connect_nats
from contracts.exceptions import FleetUnavailable, StoreUnavailable
from services.settings import Settings
from services.store.connect import connect as pg_connect
from services.store.migrate import apply_migrations, pending_migrations
from workers.app import Fleet
from workers.compactor import COMPACTOR_DURABLE

from . import MIGRATIONS_DIR
from .datafolder import (
    DataFolderLock,
    ServerRecord,
    clear_orphans,
    forget_server_records,
    lock_data_folder,
    read_server_records,
    write_server_records,
)
from .credentials import DATA_FOLDER_MODE, as_identity, load_or_create_credentials, secure_folder
from .embedded import EmbeddedNats, EmbeddedPostgres, PortTaken, port_is_free
from .nats_accounts import authorization_conf, embedded_grants
from .provision import ProvisionResult, provision_streams
from .supervise import supervise

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
    "supervise_servers",
]

log = logging.getLogger("ctxfleet")


class SchemaBehind(RuntimeError):
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
    """The NATS and Postgres this process uses, and the embedded ones it owns (if any).

    Owning embedded servers means holding the data folder's lock (``lock``), so no other
    ``ctxfleet up`` can start a second server on the same stores.
    """

    nats_urls: tuple[str, ...]  # one server, or a cluster's
    database_url: str
    owned: list[EmbeddedNats | EmbeddedPostgres] = field(default_factory=list)
    data_dir: Path | None = None
    lock: DataFolderLock | None = None
    _own_lock: bool = False
    _recorded: set[int] = field(default_factory=set)

    def record(self) -> None:
        """Write each owned server's PID and start time down, so a later run can find an orphan."""
        if self.data_dir is None or not self.owned:
            return
        records = []
        for server in self.owned:
            identity = server.identity()
            if identity is not None:
                port = server.port if isinstance(server, EmbeddedNats) else None
                records.append(
                    ServerRecord(
                        server.name,
                        identity.pid,
                        identity.create_time,
                        str(server.store),
                        str(server.log_path),
                        port,
                    )
                )
        write_server_records(self.data_dir, records)
        self._recorded.update(r.pid for r in records)

    def stop(self) -> None:
        """Stop the embedded servers this process started (and let go of the folder if we took it)."""
        for server in reversed(self.owned):
            try:
                server.stop()
            except Exception as exc:  # one server failing to stop must not leave the other running
                log.warning("stopping %s: %s", server.name, exc)
        # Only our own list: if the folder was removed and recreated under us, it is another run's.
        if (
            self.data_dir is not None
            and {r.pid for r in read_server_records(self.data_dir).values()} <= self._recorded
        ):
            forget_server_records(self.data_dir)
        self.owned.clear()
        if self._own_lock and self.lock is not None:
            self.lock.release()


def start_servers(settings: Settings, lock: DataFolderLock | None = None) -> Servers:
    """External servers where ``CTX_*_URL`` is set, embedded ones under the data folder otherwise.

    Embedded servers need the data folder's lock: ``lock`` if the caller holds it already, else it
    is taken here (``DataFolderBusy`` if another ``ctxfleet up`` has it). With the lock held,
    servers a crashed run left on the folder are stopped before anything new starts.
    """
    owned: list[EmbeddedNats | EmbeddedPostgres] = []
    nats_urls = settings.bus.nats_url
    database_url = settings.store.database_dsn
    if nats_urls is not None and database_url is not None:
        return Servers(nats_urls=nats_urls, database_url=database_url, lock=lock)
    data_dir = settings.embedded.data_dir
    own_lock = lock is None
    held = lock if lock is not None else lock_data_folder(data_dir)
    # Credentials, endpoints and the broker's store: the owner's alone.
    secure_folder(data_dir, DATA_FOLDER_MODE)
    servers = Servers(
        nats_urls or (), database_url or "", owned, data_dir=data_dir, lock=held, _own_lock=own_lock
    )
    try:
        previous_port = _recorded_port(data_dir)
        orphans = clear_orphans(data_dir, [data_dir / "postgres", data_dir / "nats"], timeout=_ORPHAN_STOP_S)
        if orphans:
            log.warning("stopped servers a previous run of %s left: %s", data_dir, "; ".join(orphans))
        previous_port = _client_port(settings.embedded.nats_port, previous_port)
        credentials = load_or_create_credentials(data_dir, settings.bus.tenant_names)
        if database_url is None:
            pg = EmbeddedPostgres(data_dir / "postgres", sole_owner=True, password=credentials.postgres)
            owned.append(pg)
            servers.database_url = pg.start()
            servers.record()  # at once: a crash before NATS is up must still leave PostgreSQL findable
        if nats_urls is None:
            # Closed: only the generated users connect, each confined to its subjects (infra.credentials).
            secure_folder(data_dir / "nats")  # raw events and the users' passwords (nats.conf)
            broker = EmbeddedNats(
                data_dir / "nats",
                max_payload=settings.embedded.nats_max_payload,
                port=previous_port,
                sync_always=settings.embedded.nats_sync_always,
                max_store=settings.embedded.nats_max_store_mb * 1024 * 1024,
                extra_config=authorization_conf(
                    lambda user: json.dumps(credentials.password(user)),
                    embedded_grants(settings.bus.tenant_names),
                ),
            )
            owned.append(broker)
            servers.nats_urls = (_start_broker(broker),)
            servers.record()
    except BaseException:
        # Ctrl-C during start included: nothing we started may outlive us.
        servers.stop()
        raise
    return servers


# Starts on a port found free that another process took first, before we give up.
_PORT_ATTEMPTS = 3


def _start_broker(broker: EmbeddedNats) -> str:
    """Start ``broker``; on a port another server took meanwhile, on a free one instead (said in the log).

    The port was free when chosen, but another checkout's ``make run`` may bind it first: ours then
    exits, and the fleet must never connect to the server that answers there instead.
    """
    left = _PORT_ATTEMPTS
    while True:
        try:
            return broker.start()
        except PortTaken as exc:
            left -= 1
            if left == 0:
                raise
            log.warning("%s; the embedded NATS listens on a free port instead ('ctxfleet env' names it)", exc)
            broker.port = 0


def _client_port(configured: int, previous: int) -> int:
    """The embedded broker's port: the configured one (``CTX_NATS_PORT``), else the last run's (a client
    still connected to an orphan reconnects there), else any free one — said in the log, and
    ``ctxfleet env`` prints whichever it is."""
    for candidate in (configured, previous):
        if candidate and port_is_free(candidate):
            return candidate
    if configured:
        log.warning(
            "port %d is taken: the embedded NATS listens on a free port ('ctxfleet env' names it)", configured
        )
    return 0


def _recorded_port(data_dir: Path) -> int:
    """The port the last run's broker used: a client still connected to an orphan reconnects there."""
    record = read_server_records(data_dir).get(EmbeddedNats.name)
    return record.port if record is not None and record.port else 0


# An orphan gets this long after SIGTERM/SIGINT before SIGKILL: enough for a JetStream flush and a
# PostgreSQL fast shutdown checkpoint on a laptop disk.
_ORPHAN_STOP_S = 15.0


async def supervise_servers(settings: Settings, servers: Servers) -> NoReturn:
    """Keep the embedded servers of ``servers`` running (see ``infra.supervise``); never returns.

    Raises:
        ServerDied: one exited past ``CTX_SERVER_RESTARTS`` or could not be restarted.
    """
    if not servers.owned:
        await asyncio.Future()  # nothing of ours to watch: external servers have their own keepers
    await supervise(
        servers.owned,
        restarts=settings.embedded.server_restarts,
        on_restart=servers.record,
    )


async def migrate(
    database_url: str, settings: Settings | None = None, directory: Path = MIGRATIONS_DIR
) -> list[str]:
    options = settings.store.database_options() if settings is not None else {}
    conn = await pg_connect(database_url, **options)
    try:
        return await apply_migrations(conn, directory)
    finally:
        await conn.close()


async def require_current_schema(
    database_url: str, settings: Settings, directory: Path = MIGRATIONS_DIR
) -> None:
    """Refuse to serve on a database this build's migrations have not reached (the Job's task, not ours)."""
    conn = await pg_connect(database_url, **settings.store.database_options())
    try:
        pending = await pending_migrations(conn, directory)
    finally:
        await conn.close()
    if pending:
        raise SchemaBehind(pending)


async def provision(
    nats_urls: tuple[str, ...], settings: Settings, *, force: bool = False
) -> ProvisionResult:
    """Check the broker and create or reconcile the streams (``CTX_STREAM_REPLICAS`` copies of each)."""
    nc = await connect_nats(nats_urls, name="ctxfleet-provision", **settings.bus.nats_options())
    try:
        result = await provision_streams(
            nc, partitions=settings.bus.partitions, force=force, replicas=settings.bus.stream_replicas
        )
        log.info("streams: events %s, dead letters %s, jobs %s", result.events, result.dead, result.jobs)
        return result
    finally:
        await nc.close()


async def start_fleet(settings: Settings, servers: Servers) -> Fleet:
    """Migrate, provision and start the configured workers (as ``fleet`` on the embedded server)."""
    settings = as_identity(settings, "fleet")
    await migrate(servers.database_url, settings)
    await provision(servers.nats_urls, settings)
    fleet = Fleet(settings, nats_urls=servers.nats_urls, database_url=servers.database_url)
    broker = next((s for s in servers.owned if isinstance(s, EmbeddedNats)), None)
    if broker is not None:
        # The store as supervision last measured it: full before any write of ours is refused.
        fleet.extra_checks["jetstream"] = lambda: broker.store_problem
    await fleet.start()
    return fleet


async def fleet_prerequisites(settings: Settings, servers: Servers) -> None:
    """What someone else must have done before these workers can serve: migrations, and provisioning.

    Provisioning is checked where a worker would fail without it (the compactor binds the durable
    consumer that ``ctxfleet provision`` creates last); recorders retry on their own, others need none.
    """
    await require_current_schema(servers.database_url, settings)
    if "compactor" in settings.process.worker_names:
        nc = await connect_nats(
            servers.nats_urls, name="ctxfleet-startup-check", **settings.bus.nats_options()
        )
        try:
            await nc.jetstream(timeout=5.0).consumer_info(JOBS_STREAM, COMPACTOR_DURABLE)
        except NotFoundError as exc:
            raise NotProvisioned(str(exc)) from None
        except NatsTimeout:
            # Unanswered, not refused: on a cluster, the consumer's copies may be electing a leader.
            raise FleetUnavailable(
                f"JetStream did not answer about the {COMPACTOR_DURABLE} consumer of {JOBS_STREAM}"
            ) from None
        finally:
            await nc.close()


async def serve_workers(settings: Settings, servers: Servers) -> Fleet:
    """Start workers on a fleet someone else migrated and provisioned (``ctxfleet worker``, the image).

    Workers run with least privilege: a worker's NATS user cannot create streams, so checking and
    creating them is ``ctxfleet provision``'s job, run once (the k8s Job, Compose's one-shot service).
    With ``CTX_STARTUP_WAIT_S`` the worker waits that long for it (live, not ready) instead of exiting.
    """
    fleet = Fleet(settings, nats_urls=servers.nats_urls, database_url=servers.database_url)
    try:
        await fleet.start(prerequisites=partial(fleet_prerequisites, settings, servers), retry_on=_NOT_YET)
    except BaseException as exc:
        await fleet.stop()
        if isinstance(exc, NotFoundError):
            raise NotProvisioned(str(exc)) from None
        raise
    return fleet


# A fresh deployment: the migration Job, PostgreSQL or NATS may simply not be there yet.
_NOT_YET: tuple[type[BaseException], ...] = (SchemaBehind, NotProvisioned, StoreUnavailable, FleetUnavailable)
