"""Recorders as separate processes: partition ownership, per-thread order, crash recovery."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import TEST_PARTITIONS, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

ROOT = Path(__file__).resolve().parents[2]


class Recorders:
    """Starts ``ctxfleet worker recorder`` processes and stops them all at the end."""

    def __init__(self, nats_url: str, database_url: str, tmp: Path) -> None:
        self.env = {
            **os.environ,
            "CTX_NATS_URL": nats_url,
            "CTX_DATABASE_URL": database_url,
            "CTX_PARTITIONS": str(TEST_PARTITIONS),
            "CTX_DATA_DIR": str(tmp / "data"),
        }
        self.procs: list[subprocess.Popen[bytes]] = []
        self.tmp = tmp

    def start(self, recorder_id: str, partitions: str, batch: int = 256) -> subprocess.Popen[bytes]:
        env = {
            **self.env,
            "CTX_RECORDER_ID": recorder_id,
            "CTX_RECORDER_PARTITIONS": partitions,
            "CTX_RECORD_BATCH": str(batch),
        }
        log = open(self.tmp / f"{recorder_id}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "worker", "recorder"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def recorders(streams: str, database_url: str, tmp_path: Path) -> Iterator[Recorders]:
    r = Recorders(streams, database_url, tmp_path)
    yield r
    r.stop_all()


async def _publish(client: FleetClient, threads: list[Thread], per_thread: int) -> None:
    async def one(t: Thread) -> None:
        for i in range(per_thread):
            await client.append(t.user(f"{t.run_id} message {i}", key=f"m{i:04d}"))

    await asyncio.gather(*(one(t) for t in threads))


async def _records_total(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM ctx.records"))


async def _assert_each_thread_in_publish_order(
    db: asyncpg.Connection, threads: list[Thread], per_thread: int
) -> None:
    for t in threads:
        rows = await db.fetch(
            "SELECT seq, event_key FROM ctx.records WHERE thread_id=$1 ORDER BY seq", t.thread_id
        )
        assert [r["seq"] for r in rows] == list(range(1, per_thread + 1))
        assert [r["event_key"] for r in rows] == [f"m{i:04d}" for i in range(per_thread)]


async def test_two_recorder_processes_share_partitions_and_keep_per_thread_order(
    recorders: Recorders, client: FleetClient, db: asyncpg.Connection
) -> None:
    recorders.start("rec-a", "0/2")
    recorders.start("rec-b", "1/2")
    threads = [Thread() for _ in range(40)]
    await _publish(client, threads, per_thread=25)

    async def done() -> bool:
        return await _records_total(db) == 40 * 25

    await eventually(done, timeout=60, what="1000 records")
    await _assert_each_thread_in_publish_order(db, threads, 25)
    writers = {
        r["recorded_by"]: r["n"]
        for r in await db.fetch("SELECT recorded_by, count(*) AS n FROM ctx.records GROUP BY 1")
    }
    assert set(writers) == {"rec-a", "rec-b"} and all(n > 0 for n in writers.values())
    # Each thread was written by exactly one process: the owner of its partition.
    per_thread = await db.fetch(
        "SELECT thread_id, count(DISTINCT recorded_by) AS n FROM ctx.records GROUP BY 1"
    )
    assert all(r["n"] == 1 for r in per_thread)


async def test_recorder_killed_mid_burst_resumes_without_loss_duplicates_or_reordering(
    recorders: Recorders, client: FleetClient, db: asyncpg.Connection
) -> None:
    victim = recorders.start("rec-victim", "all", batch=20)
    threads = [Thread() for _ in range(20)]
    await _publish(client, threads, per_thread=100)

    async def some() -> bool:
        return await _records_total(db) >= 200

    await eventually(some, timeout=60, what="the first records")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert await _records_total(db) < 2000, "the burst finished before the kill; the test proves nothing"
    recorders.start("rec-successor", "all")

    async def done() -> bool:
        return await _records_total(db) == 2000

    await eventually(done, timeout=60, what="all 2000 records")
    await _assert_each_thread_in_publish_order(db, threads, 100)
    assert await db.fetchval("SELECT count(*) FROM ctx.dead_letters") == 0
