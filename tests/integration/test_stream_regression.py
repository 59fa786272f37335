"""The events stream lost under the recorder's positions: halt loudly, then re-baseline without loss.

Losing the JetStream store (``rm -rf .ctxfleet/nats/jetstream``) and provisioning again is, to the
fleet, ``delete_stream`` + ``provision_streams``: the stream is re-created and its sequences restart
below the positions committed in Postgres.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import nats
import pytest

from contracts.subjects import EVENTS_STREAM
from infra.cli import main as cli_main
from infra.provision import provision_streams
from infra.rebaseline import rebaseline
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import TEST_PARTITIONS, eventually, make_settings
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

StartFleet = Callable[..., Awaitable[Fleet]]


async def _recreate_events_stream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().delete_stream(EVENTS_STREAM)
        await provision_streams(nc, partitions=TEST_PARTITIONS)
    finally:
        await nc.close()


async def _publish(client: FleetClient, t: Thread, keys: range) -> list[int]:
    return [(await client.append(t.user(f"message {i}", key=f"m{i:03d}"))).stream_seq for i in keys]


async def _keys(db: asyncpg.Connection, t: Thread) -> list[str]:
    rows = await db.fetch(
        "SELECT seq, event_key FROM ctx.records WHERE thread_id = $1 ORDER BY seq", t.thread_id
    )
    assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1)), "seqs must stay consecutive"
    return [r["event_key"] for r in rows]


def _expected(keys: range) -> list[str]:
    return [f"m{i:03d}" for i in keys]


async def _unready_because(fleet: Fleet, words: str) -> bool:
    return words in ((await fleet.readiness()).get("consumers") or "")


async def _ready(fleet: Fleet) -> bool:
    return all(v is None for v in (await fleet.readiness()).values())


async def _positions(db: asyncpg.Connection) -> dict[int, int]:
    rows = await db.fetch("SELECT partition, last_stream_seq FROM ctx.tracking WHERE consumer = 'recorder'")
    return {r["partition"]: r["last_stream_seq"] for r in rows}


async def test_recorder_halts_on_a_recreated_stream_and_records_everything_once_after_rebaseline(
    start_fleet: StartFleet,
    client: FleetClient,
    db: asyncpg.Connection,
    streams: str,
    database_url: str,
    tmp_path: Path,
) -> None:
    fleet = await start_fleet()
    a = Thread()
    await _publish(client, a, range(0, 10))
    await eventually(lambda: _has(db, a, 10), what="the first 10 records")
    await eventually(lambda: _ready(fleet), what="a ready fleet")

    await _recreate_events_stream(streams)
    # A runtime retrying its last three events after the outage (already in the ledger), then new ones.
    # The new stream ends up longer than the old position: only its identity gives the loss away.
    seqs = await _publish(client, a, range(7, 15))
    b = Thread()
    seqs += await _publish(client, b, range(0, 5))
    assert seqs == list(range(1, 14)), "JetStream acked every publish into the new stream"
    committed = await _positions(db)
    assert max(committed.values()) == 10

    await eventually(
        lambda: _unready_because(fleet, "was recreated at"),
        timeout=20,
        what="readiness naming the regression",
    )
    reason = (await fleet.readiness())["consumers"]
    assert reason is not None and reason.startswith(f"events stream {EVENTS_STREAM} was recreated at")
    assert reason.endswith("nothing after it is being recorded; inspect, then run 'ctxfleet rebaseline'")
    assert fleet.metrics.registry.get_sample_value("ctx_recorder_halted") == 1
    assert await _keys(db, a) == _expected(range(0, 10)) and await _keys(db, b) == []
    assert await _positions(db) == committed, "a halted recorder commits nothing"

    settings = make_settings(streams, database_url, tmp_path)
    dry = await rebaseline((streams,), database_url, settings, apply=False)
    assert not dry.applied and dry.plan.verdict.kind == "recreated"
    assert {r.partition: r.new for r in dry.plan.resets} == dict.fromkeys(committed, 0)
    assert await _positions(db) == committed, "a dry run changes nothing"

    duplicates_before = fleet.metrics.registry.get_sample_value("ctx_events_duplicate_total") or 0.0
    done = await rebaseline((streams,), database_url, settings, apply=True)
    assert done.applied
    # The running fleet notices on its own: no restart.
    await eventually(lambda: _has(db, b, 5), timeout=20, what="the new thread's records")
    await eventually(lambda: _has(db, a, 15), timeout=20, what="the old thread's new records")
    assert await _keys(db, a) == _expected(range(0, 15)), "each event once, in publish order"
    assert await _keys(db, b) == _expected(range(0, 5))
    assert fleet.metrics.registry.get_sample_value("ctx_events_duplicate_total") - duplicates_before == 3, (
        "re-sent events recognised, not re-recorded"
    )
    await eventually(lambda: _ready(fleet), what="the fleet ready again")
    assert fleet.metrics.registry.get_sample_value("ctx_recorder_halted") == 0
    created = await db.fetchval("SELECT created FROM ctx.stream_baselines WHERE stream = $1", EVENTS_STREAM)
    assert created == done.stream.created


async def test_rebaseline_cli_with_the_fleet_stopped_lets_the_next_fleet_record_the_new_stream(
    start_fleet: StartFleet,
    client: FleetClient,
    db: asyncpg.Connection,
    streams: str,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = await start_fleet()
    t = Thread()
    await _publish(client, t, range(0, 20))
    await eventually(lambda: _has(db, t, 20), what="20 records")
    await first.stop()
    await _recreate_events_stream(streams)
    await _publish(client, t, range(20, 25))

    halted = await start_fleet()
    await eventually(
        lambda: _unready_because(halted, "went backwards: last seq 5 < committed position 20 of partition"),
        timeout=20,
        what="readiness naming the regression on start",
    )
    await halted.stop()
    assert await _keys(db, t) == _expected(range(0, 20))

    monkeypatch.setenv("CTX_NATS_URL", streams)
    monkeypatch.setenv("CTX_DATABASE_URL", database_url)
    capsys.readouterr()
    assert await asyncio.to_thread(cli_main, ["rebaseline"]) == 0
    shown = capsys.readouterr().out
    assert f"events stream {EVENTS_STREAM}: first seq 1, last seq 5, created" in shown
    assert "<- reset" in shown and "dry run, nothing changed" in shown
    assert max((await _positions(db)).values()) == 20

    assert await asyncio.to_thread(cli_main, ["rebaseline", "--yes"]) == 0
    assert "reset 1 positions to 0: recording resumes from seq 1" in capsys.readouterr().out
    assert set((await _positions(db)).values()) == {0}

    again = await start_fleet()
    await eventually(lambda: _has(db, t, 25), timeout=20, what="the 5 new records")
    assert await _keys(db, t) == _expected(range(0, 25))
    await eventually(lambda: _ready(again), what="a ready fleet")

    assert await asyncio.to_thread(cli_main, ["rebaseline", "--yes"]) == 0
    assert "nothing to re-baseline" in capsys.readouterr().out


async def test_recorder_records_the_stream_identity_on_a_fresh_database_and_adopts_it_for_older_positions(
    start_fleet: StartFleet, client: FleetClient, db: asyncpg.Connection, streams: str
) -> None:
    fleet = await start_fleet()
    await eventually(lambda: _ready(fleet), what="a ready fleet on a fresh database")
    nc = await nats.connect(streams)
    try:
        created = (await nc.jetstream().stream_info(EVENTS_STREAM)).created
    finally:
        await nc.close()
    assert (
        await db.fetchval("SELECT created FROM ctx.stream_baselines WHERE stream = $1", EVENTS_STREAM)
        == created
    )

    t = Thread()
    await _publish(client, t, range(0, 3))
    await eventually(lambda: _has(db, t, 3), what="3 records")
    await fleet.stop()
    # As a database whose positions were committed before stream identities were recorded.
    await db.execute("DELETE FROM ctx.stream_baselines")
    await _publish(client, t, range(3, 5))

    again = await start_fleet()
    await eventually(lambda: _has(db, t, 5), timeout=20, what="recording resumed on the adopted stream")
    assert await _keys(db, t) == _expected(range(0, 5))
    assert (
        await db.fetchval("SELECT created FROM ctx.stream_baselines WHERE stream = $1", EVENTS_STREAM)
        == created
    )
    await eventually(lambda: _ready(again), what="a ready fleet")


async def test_rebaseline_refuses_clearly_when_the_events_stream_does_not_exist(
    db: asyncpg.Connection, streams: str, database_url: str, tmp_path: Path
) -> None:
    from infra.rebaseline import RebaselineError

    nc = await nats.connect(streams)
    try:
        await nc.jetstream().delete_stream(EVENTS_STREAM)
    finally:
        await nc.close()
    with pytest.raises(RebaselineError, match="does not exist: run 'ctxfleet provision' first"):
        await rebaseline((streams,), database_url, make_settings(streams, database_url, tmp_path), apply=True)


async def test_a_lost_tail_of_the_same_stream_is_repaired_without_an_operator_and_nothing_new_is_skipped(
    start_fleet: StartFleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    first = await start_fleet()
    t = Thread()
    seqs = await _publish(client, t, range(0, 6))
    await eventually(lambda: _has(db, t, 6), what="6 records")
    await first.stop()
    # What a nats-server killed before flushing leaves: the same stream (identity kept), shorter than
    # the positions. Here the positions run ahead instead; to the recorder it is the same state.
    partition = next(p for p, seq in (await _positions(db)).items() if seq == seqs[-1])
    await db.execute(
        "UPDATE ctx.tracking SET last_stream_seq = $2 WHERE consumer = 'recorder' AND partition = $1",
        partition,
        seqs[-1] + 3,
    )
    fleet = await start_fleet()
    # Ready means checked: the repair happened on start, before anything new arrived (a tail lost and
    # refilled past the old position before any check would look intact — hence sync_interval: always).
    await eventually(lambda: _ready(fleet), what="a ready fleet: nothing for an operator to do")
    assert fleet.metrics.registry.get_sample_value("ctx_recorder_stream_truncations_total") == 1
    # The next publishes get seqs just past the stream's end, which the stale position would skip.
    await _publish(client, t, range(6, 10))
    await eventually(lambda: _has(db, t, 10), timeout=20, what="the 4 events after the lost tail")
    assert await _keys(db, t) == _expected(range(0, 10))


async def _has(db: asyncpg.Connection, thread: Thread, n: int) -> bool:
    return (
        int(await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id = $1", thread.thread_id)) >= n
    )
