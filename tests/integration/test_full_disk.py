"""A full JetStream store, a full disk and a read-only PostgreSQL: typed refusals, nothing acked lost,
readiness says why, and the fleet recovers by itself once the store takes writes again.

The embedded broker runs as ``ctxfleet up`` runs it: started by ``EmbeddedNats`` and tended by
``supervise`` (which raises the store limit as the disk gains room, and restarts a server whose
store met a full disk once there is room again). A full disk is a real one where the sandbox lets
us mount a small tmpfs; everywhere (CI included), a tiny configured store limit
(``CTX_NATS_MAX_STORE_MB``) fills the same way and is raised by the same config reload.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import pytest

from contracts import ContextPolicy, PrepareRequest
from infra.embedded import EmbeddedNats, EmbeddedPostgres, free_port
from infra.runtime import Servers, migrate, start_fleet
from infra.supervise import supervise
from ctxfleet_client.client import FleetClient
from contracts.exceptions import FleetUnavailable, NotYetRecorded, ThreadNotFound
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually, make_settings, reset_streams
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

MIB = 1 << 20
# Events the size the campaign filled its disk with.
BIG = "x" * 180_000


def _mount_tmpfs(where: Path, size_mb: int) -> None:
    """A small real filesystem; skips the test (with the reason) where the sandbox forbids mounting."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({done.stderr.strip()}); the store-limit variant runs instead"
        )


def _resize_tmpfs(where: Path, size_mb: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_mb}m", str(where)], check=True)


@contextmanager
def _tmpfs(where: Path, size_mb: int) -> Iterator[Path]:
    _mount_tmpfs(where, size_mb)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _readyz(port: int) -> tuple[int, dict[str, str]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return reply.status, json.loads(reply.read())["checks"]
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["checks"]


@dataclass
class Running:
    """An embedded broker under supervision, a fleet on it, and a client."""

    broker: EmbeddedNats
    fleet: Fleet
    client: FleetClient
    database_url: str
    # (thread, event key) of every event JetStream acknowledged.
    acked: list[tuple[str, str]] = field(default_factory=list)

    async def fill(self) -> FleetUnavailable:
        """Publish big events until JetStream refuses one; returns the refusal (typed)."""
        for _ in range(2_000):
            event = Thread().user(BIG)
            started = time.monotonic()
            try:
                await self.client.append(event, timeout=5.0)
            except FleetUnavailable as refused:
                assert time.monotonic() - started < 2.0, "refused at once, not after a timeout"
                return refused
            self.acked.append((event.thread_id, event.event_key))
        raise AssertionError("the store never filled")

    async def all_recorded(self) -> bool:
        conn = await asyncpg.connect(self.database_url)
        try:
            stored = await conn.fetchval(
                "SELECT count(*) FROM ctx.records r JOIN unnest($1::text[], $2::text[]) AS a(t, k) "
                "ON r.thread_id = a.t AND r.event_key = a.k",
                [t for t, _ in self.acked],
                [k for _, k in self.acked],
            )
        finally:
            await conn.close()
        return int(stored) == len(self.acked)

    async def takes_events(self) -> bool:
        event = Thread().user("room again")
        try:
            await self.client.append(event, timeout=2.0)
        except FleetUnavailable:
            return False
        self.acked.append((event.thread_id, event.event_key))
        return True


@asynccontextmanager
async def _running(broker: EmbeddedNats, database_url: str, tmp_path: Path) -> AsyncIterator[Running]:
    await asyncio.to_thread(broker.start)
    settings = make_settings(broker.url, database_url, tmp_path, http_port=free_port())
    supervisor = asyncio.create_task(supervise([broker], restarts=3, interval_s=0.2))
    fleet = await start_fleet(settings, Servers((broker.url,), database_url, owned=[broker]))
    client = await FleetClient.connect(broker.url)
    try:
        yield Running(broker, fleet, client, database_url)
    finally:
        supervisor.cancel()
        await client.close()
        await fleet.stop()
        await asyncio.to_thread(broker.stop)


async def _thread_over_its_budget(client: FleetClient) -> tuple[Thread, str]:
    """A thread whose history is far over a 900-token prepare: that prepare needs a compaction."""
    policy = ContextPolicy(name=f"full-{uuid.uuid4().hex[:6]}", model_profile=None, budget_tokens=100_000)
    await client.register_policy(policy)
    t = Thread()
    await client.append(t.system("You fix bugs.").model_copy(update={"policy": policy.name}))
    key = ""
    for i in range(8):
        await client.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat f{i}.py"}),)))
        key = f"out{i}"
        await client.append(t.outcome(f"c{i}", f"contents of f{i}.py " * 60, key=key))
    return t, key


def _prepare(t: Thread, after: str) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=900,
        after_event_key=after,
    )


Grow = Callable[[EmbeddedNats], None]


@pytest.fixture(params=["tmpfs", "store-limit"])
def small_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[EmbeddedNats, Grow]]:
    """A broker whose store fills after a few MiB, and how to give it room again."""
    if request.param == "tmpfs":
        with _tmpfs(tmp_path / "nats", 48) as mounted:
            # Configured generously: the disk is what fills (its room caps the store's limit).
            yield EmbeddedNats(mounted), lambda _: _resize_tmpfs(mounted, 256)
        return

    def raise_limit(broker: EmbeddedNats) -> None:
        broker.max_store = 64 * MIB

    yield EmbeddedNats(tmp_path / "nats", max_store=4 * MIB), raise_limit


async def test_a_full_store_refuses_at_once_loses_nothing_says_so_and_recovers_when_it_has_room(
    small_store: tuple[EmbeddedNats, Grow], database_url: str, tmp_path: Path
) -> None:
    broker, grow = small_store
    async with _running(broker, database_url, tmp_path) as fleet:
        t, last = await _thread_over_its_budget(fleet.client)
        refused = await fleet.fill()
        assert "insufficient resources" in refused.message and refused.retryable
        await eventually(fleet.all_recorded, timeout=60, what="every acked event recorded")

        # The prepare needs a compaction whose job JetStream refuses: answered anyway, at once.
        started = time.monotonic()
        prepared = await fleet.client.prepare(_prepare(t, last))
        assert time.monotonic() - started < 3.0
        assert (
            prepared.budget_report.used.total <= 900 and prepared.budget_report.reductions.dropped_history > 0
        )
        status, checks = await asyncio.to_thread(_readyz, fleet.fleet.http_port or 0)
        assert status == 503, checks
        assert "insufficient resources" in checks["jetstream"] or "store full" in checks["jetstream"], checks

        grow(broker)  # supervision raises the limit by a config reload: no restart

        pid = broker.identity()
        await eventually(fleet.takes_events, timeout=30, what="JetStream to take events again")
        assert broker.identity() == pid

        async def compacted_and_ready() -> bool:
            again = await fleet.client.prepare(_prepare(t, last))
            status, _ = await asyncio.to_thread(_readyz, fleet.fleet.http_port or 0)
            return again.summary is not None and status == 200

        await eventually(compacted_and_ready, timeout=60, what="a compaction and /readyz ready again")
        await eventually(fleet.all_recorded, timeout=60, what="every acked event recorded")


async def test_a_store_that_met_a_full_disk_is_restarted_once_the_disk_has_room_and_loses_nothing(
    database_url: str, tmp_path: Path
) -> None:
    with _tmpfs(tmp_path / "nats", 64) as mounted:
        broker = EmbeddedNats(mounted)
        async with _running(broker, database_url, tmp_path) as fleet:
            # Something else fills the disk after the limit was set: JetStream's writes fail.
            ballast = mounted / "ballast"
            free = shutil.disk_usage(mounted).free
            ballast.write_bytes(b"\0" * (free - 2 * MIB))
            before = broker.identity()
            with pytest.raises(FleetUnavailable):
                for _ in range(40):
                    event = Thread().user(BIG)
                    await fleet.client.append(event, timeout=2.0)
                    fleet.acked.append((event.thread_id, event.event_key))

            async def says_why() -> bool:
                _, checks = await asyncio.to_thread(_readyz, fleet.fleet.http_port or 0)
                return "store write failed" in checks["jetstream"]

            await eventually(says_why, timeout=10, what="/readyz naming the failed store write")
            ballast.unlink()
            await eventually(fleet.takes_events, timeout=60, what="JetStream restarted and taking events")
            assert broker.identity() != before
            await eventually(fleet.all_recorded, timeout=60, what="every acked event recorded")


@pytest.fixture
def own_postgres(server_folder: Path) -> Iterator[str]:
    """A cluster of its own: ``ALTER SYSTEM`` changes a whole server."""
    pg = EmbeddedPostgres(server_folder / "data", delete_on_stop=True)
    try:
        yield pg.start()
    finally:
        pg.stop()


async def test_a_read_only_postgres_records_nothing_says_why_and_records_everything_once_writable(
    nats_url: str, own_postgres: str, tmp_path: Path
) -> None:
    # A read-only remount of a running server's folder is refused by the kernel (its files are open for
    # writing), so PostgreSQL is made read-only the way a standby or an operator makes it.
    url = own_postgres
    await migrate(url)
    await reset_streams(nats_url)
    settings = make_settings(nats_url, url, tmp_path, http_port=free_port())
    fleet = await start_fleet(settings, Servers((nats_url,), url))
    client = await FleetClient.connect(nats_url)
    admin = await asyncpg.connect(url)
    try:
        t = Thread()
        await client.append(t.system("before"))

        async def recorded(n: int) -> bool:
            try:
                return (await client.inspect(t.thread_id)).record_count == n
            except ThreadNotFound:
                return False

        await eventually(lambda: recorded(1), timeout=15, what="the first event recorded")
        await admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        await admin.execute("SELECT pg_reload_conf()")
        acked = [t.user(f"while read-only {i}") for i in range(5)]
        for event in acked:
            await client.append(event)

        async def says_read_only() -> bool:
            status, checks = await asyncio.to_thread(_readyz, fleet.http_port or 0)
            return status == 503 and "read-only" in checks["postgres"]

        await eventually(says_read_only, timeout=15, what="/readyz naming the read-only database")
        assert await recorded(1)
        # A prepare naming an event acked meanwhile is refused typed and retryable, not lost or hung.
        with pytest.raises(NotYetRecorded) as waiting:
            await client.prepare(
                PrepareRequest(
                    session_id=t.session_id,
                    run_id=t.run_id,
                    instance_id=t.instance_id,
                    budget_tokens=3_000,
                    after_event_key=acked[0].event_key,
                    wait_ms=300,
                )
            )
        assert waiting.value.retryable
        await admin.execute("SET default_transaction_read_only = off")
        await admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
        await admin.execute("SELECT pg_reload_conf()")

        async def all_recorded() -> bool:
            status, _ = await asyncio.to_thread(_readyz, fleet.http_port or 0)
            return await recorded(6) and status == 200

        await eventually(all_recorded, timeout=30, what="the events acked meanwhile recorded")
    finally:
        await admin.close()
        await client.close()
        await fleet.stop()
