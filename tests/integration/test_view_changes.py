"""Commits that change a view are announced and a fleet's listener acts on them,
on the session's real PostgreSQL and NATS."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import asyncpg
import pytest

from contracts import PrepareRequest
from services.app.views import ViewLoader
from services.edge.client import FleetClient
from services.errors import ThreadNotFound
from services.store.connect import create_pool
from services.store.postgres import PgStore
from services.store.view_changes import CHANNEL, ViewChangeListener
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

# Tables a view load reads whose rows never change once written, so no notice is needed: what a view
# reads of them is fixed by keys that the announced tables hold.
_IMMUTABLE = {
    "policies": "a registration adds a revision; a session pins one revision",
    "tool_catalogs": "a release's catalog is written once; a session pins one",
    "blobs": "content-addressed: a hash names its bytes",
}
# Read only as of the head, which every write of them moves in the same transaction (the head's
# notice is theirs): a record beyond the head's last_seq is in no view yet, and facts are cached per
# head revision by the loader already.
_AS_OF_HEAD = {"records", "state_facts", "state_versions"}
_TRIGGERS = {"view_changes_ins", "view_changes_upd", "view_changes_del", "view_changes_trunc"}
# The session row is bumped by every batch, and a thread's view row marked evaluated by every
# budgeter pass: row triggers that let those changes alone pass silently.
_ROW_TRIGGERS = {
    "sessions": {"view_changes_row", "view_changes_row_upd", "view_changes_trunc"},
    "thread_views": {"view_changes_ins", "view_changes_row_upd", "view_changes_del", "view_changes_trunc"},
}


class _Sink:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.changes: list[tuple[str, str]] = []

    def listening(self) -> None:
        self.events.append("listening")

    def deaf(self) -> None:
        self.events.append("deaf")

    def changed(self, kind: str, key: str) -> None:
        self.changes.append((kind, key))

    def head_moved(self, thread_id: str, revision: int) -> None:
        self.changes.append(("head", f"{revision}:{thread_id}"))

    def calibration_changed(self, tenant: str, profile: str) -> None:
        self.changes.append(("calibration", f"{tenant}|{profile}"))

    def everything_changed(self) -> None:
        self.events.append("everything")


@contextlib.asynccontextmanager
async def _listening(database_url: str) -> AsyncIterator[tuple[_Sink, ViewChangeListener]]:
    sink = _Sink()
    listener = ViewChangeListener(database_url, sink, retry_s=(0.05, 0.2), heartbeat_s=0.1)
    await listener.start()
    try:
        yield sink, listener
    finally:
        await listener.stop()


async def _recorded(client: FleetClient, t: Thread) -> None:
    await client.append(t.system("Be brief.", key="sys"))
    await client.append(t.user("what is the weather?", key="u1"))
    await client.prepare(_request(t, after="u1"))


async def _evaluated(db: asyncpg.Connection, thread_id: str) -> bool:
    behind = await db.fetchval(
        """SELECT h.revision > COALESCE(v.evaluated_revision, 0) FROM ctx.thread_heads h
           LEFT JOIN ctx.thread_views v USING (thread_id) WHERE h.thread_id = $1""",
        thread_id,
    )
    return behind is False


def _request(t: Thread, after: str | None = None) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id="main",
        budget_tokens=4_000,
        after_event_key=after,
    )


@pytest.mark.nats
async def test_every_table_a_view_load_reads_announces_its_changes_or_never_changes(
    start_fleet, client: FleetClient, database_url: str, db: asyncpg.Connection
) -> None:
    await start_fleet()
    t = Thread()
    await _recorded(client, t)
    queries: list[str] = []

    async def logged(conn: asyncpg.Connection) -> None:
        conn.add_query_logger(lambda q: queries.append(q.query))

    pool = await create_pool(database_url, min_size=1, max_size=1, init=logged)
    try:
        async with PgStore(pool).session() as store:
            await ViewLoader().load(store, t.thread_id)
    finally:
        await pool.close()
    read = set(re.findall(r"\bctx\.([a-z_]+)", "\n".join(queries)))
    assert {"thread_heads", "sessions", "runs", "thread_views", "windows", "state_facts"} <= read, read

    rows = await db.fetch(
        """SELECT c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = 'ctx' AND t.tgname LIKE 'view_changes_%'"""
    )
    announced: dict[str, set[str]] = {}
    for row in rows:
        announced.setdefault(row["relname"], set()).add(row["tgname"])
    silent = {
        table
        for table in read - _IMMUTABLE.keys() - _AS_OF_HEAD
        if announced.get(table) != _ROW_TRIGGERS.get(table, _TRIGGERS)
    }
    assert not silent, f"a view load reads {sorted(silent)}, whose changes nobody announces"


@pytest.mark.nats
async def test_each_commit_is_announced_for_its_thread_session_or_run_and_a_rollback_is_not(
    start_fleet, client: FleetClient, database_url: str, db: asyncpg.Connection
) -> None:
    await start_fleet()
    t = Thread()
    await _recorded(client, t)
    # The budgeter's first pass creates the thread's view row (announced) once the hot path is quiet:
    # let it land before listening, or its notice would be taken for the update below.
    await eventually(lambda: _evaluated(db, t.thread_id), 10, "the budgeter's first pass")
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)
    await listener.add_listener(CHANNEL, lambda *args: heard.put_nowait(args[3]))

    async def until(payload: str) -> set[str]:
        payloads: set[str] = set()
        while payload not in payloads:
            payloads.add(await asyncio.wait_for(heard.get(), 5))
        return payloads

    try:
        tx = db.transaction()
        await tx.start()
        await db.execute("UPDATE ctx.runs SET status = status WHERE run_id = $1", t.run_id)
        await tx.rollback()
        async with db.transaction():
            await db.execute(
                "UPDATE ctx.thread_views SET view_revision = view_revision + 1 WHERE thread_id = $1",
                t.thread_id,
            )
        assert await until(f"t:{t.thread_id}") == {f"t:{t.thread_id}"}  # the rolled-back update said nothing

        await client.append(t.user("and tomorrow?", key="u2"))  # the fleet's recorder commits a record
        await client.prepare(_request(t, after="u2"))
        revision = await db.fetchval(
            "SELECT revision FROM ctx.thread_heads WHERE thread_id = $1", t.thread_id
        )
        # Its head's move names the revision it moved to (``h:<revision>:<thread>``); the batch bumped the
        # session's numbers too: nothing a view reads, so not announced.
        heard_then = await until(f"h:{revision}:{t.thread_id}")
        assert f"s:{t.session_id}" not in heard_then and f"t:{t.thread_id}" not in heard_then

        # A budgeter pass marks the thread evaluated, and an update changes nothing: neither is
        # announced (notices come in commit order, so the run's notice ends what could be heard).
        await db.execute(
            "UPDATE ctx.thread_views SET evaluated_revision = evaluated_revision + 1, updated_at = now() "
            "WHERE thread_id = $1",
            t.thread_id,
        )
        unchanged = "UPDATE ctx.thread_views SET prepare_reserved = prepare_reserved WHERE thread_id = $1"
        await db.execute(unchanged, t.thread_id)
        await db.execute("UPDATE ctx.runs SET task_budget = task_budget WHERE run_id = $1", t.run_id)
        assert f"t:{t.thread_id}" not in await until(f"r:{t.run_id}")
        await db.execute(
            "UPDATE ctx.sessions SET agent_release = 'yard@2' WHERE session_id = $1", t.session_id
        )
        await until(f"s:{t.session_id}")
    finally:
        await listener.close()


async def test_the_listener_turns_trust_on_after_its_own_notice_returns_and_off_when_its_connection_dies(
    database_url: str, db: asyncpg.Connection
) -> None:
    async with _listening(database_url) as (sink, listener):
        assert sink.events == ["listening"] and listener.up
        await db.execute(
            "SELECT pg_notify($1, 't:r-x.main'), pg_notify($1, 's:s-x'), pg_notify($1, 'zz')", CHANNEL
        )
        await eventually(lambda: _true(len(sink.changes) == 2 and "everything" in sink.events), 5, "notices")
        assert sink.changes == [("thread", "r-x.main"), ("session", "s-x")]

        killed = await db.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND query LIKE 'SELECT pg_notify($1, $2)%' AND datname = current_database()"
        )
        assert killed
        await eventually(lambda: _true("deaf" in sink.events), 5, "the listener to go deaf")
        await eventually(
            lambda: _true(sink.events[-1] == "listening" and listener.up), 5, "it to listen again"
        )
    assert sink.events[-1] == "deaf"


async def test_a_calibrations_change_is_announced_with_its_tenant_and_profile_and_a_read_is_not(
    database_url: str, db: asyncpg.Connection
) -> None:
    tenant, profile = f"acme:{time.monotonic_ns()}", 'claude "sonnet", 4'
    async with _listening(database_url) as (sink, _):
        pool = await create_pool(database_url, min_size=1, max_size=1)
        try:
            async with PgStore(pool).session() as store:
                await store.read_calibration(tenant, profile)  # a read writes nothing
                await store.update_calibration(tenant, profile, lambda c: replace(c, factor=1.25, reports=1))
        finally:
            await pool.close()
        await eventually(lambda: _true(bool(sink.changes)), 5, "the calibration's notice")
        # Notices come in commit order: the thread's notice ends what the calibration could send.
        await db.execute("SELECT pg_notify($1, 't:r-end.main')", CHANNEL)
        await eventually(lambda: _true(sink.changes[-1] == ("thread", "r-end.main")), 5, "the end mark")
        assert sink.changes == [("calibration", f"{tenant}|{profile}"), ("thread", "r-end.main")]


async def _true(value: bool) -> bool:
    return value


@pytest.mark.nats
async def test_a_prepare_naming_no_event_is_served_from_trust_until_another_process_commits_a_change(
    start_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    # No budgeter: its bookkeeping of the recorded events would be a change of the thread's own.
    fleet = await start_fleet(workers="recorder,assembler")
    t = Thread()
    await _recorded(client, t)
    served = lambda: fleet.metrics.registry.get_sample_value("ctx_view_trust_served_total") or 0.0  # noqa: E731
    await eventually(lambda: _true(fleet.metrics.registry.get_sample_value("ctx_view_trust_listening") == 1))

    first = await client.prepare(_request(t))

    async def trusted() -> bool:
        before = served()
        again = await client.prepare(_request(t))
        return served() == before + 1 and again.messages == first.messages

    await eventually(trusted, 5, "a prepare served from a trusted view")
    assert served() >= 1

    # Another process (here: this test) sets the session's principal: the view is someone's now.
    await db.execute("UPDATE ctx.sessions SET principal_id = 'alice' WHERE session_id = $1", t.session_id)

    async def refused() -> bool:
        try:
            await client.prepare(_request(t))
        except ThreadNotFound:
            return True
        return False

    # Far sooner than the view's age (5 s) would have ended its trust: the commit's notice did.
    changed_at = time.monotonic()
    await eventually(refused, 1.0, "the fleet to hear of the change")
    assert time.monotonic() - changed_at < 1.0
    # The view is alice's now: read again from the ledger, it is served to her, and the same.
    hers = await client.prepare(_request(t).model_copy(update={"principal_id": "alice"}))
    assert hers.messages == first.messages


@pytest.mark.nats
async def test_a_step_recorded_by_the_fleets_own_recorder_is_answered_from_the_view_it_extended(
    start_fleet, client: FleetClient
) -> None:
    # No budgeter: its bookkeeping of the recorded events would be a change of the thread's own.
    fleet = await start_fleet(workers="recorder,assembler")
    t = Thread()
    await _recorded(client, t)
    sample = fleet.metrics.registry.get_sample_value
    await eventually(lambda: _true(sample("ctx_view_trust_listening") == 1))
    await client.prepare(_request(t))  # loaded while listening: held and trusted

    steps = 0
    for n in range(5):
        extended, served = sample("ctx_view_trust_extended_total"), sample("ctx_view_trust_served_total")
        await client.append(t.user(f"and day {n}?", key=f"d{n}"))
        prepared = await client.prepare(_request(t, after=f"d{n}"))
        assert prepared.messages[-1].content == f"and day {n}?"
        # Extended by the recorder's commit, and the step answered from it without reading the ledger.
        steps += sample("ctx_view_trust_extended_total") == extended + 1
        steps += sample("ctx_view_trust_served_total") == served + 1
    assert steps == 10
