"""Indexer passes of one new record each, as an agent's threads give them.

An agent's thread gets a record per step, and the indexer a pass per step (at most one per 0.25 s):
what a pass costs beyond the record's chunks is paid on every step of every thread, on the fleet's
core and PostgreSQL's. 40 threads of the ingest benchmark's sample events; 30 rounds of one new
record in each thread (recorded through the recorder's service) followed by one indexer pass over
each thread. Figures per pass: this process's CPU, PostgreSQL's CPU (its postmaster and backends) and
the wall time, averaged over the 1,200 passes.

``make bench BENCH_ARGS="--only index_pass"``
"""

from __future__ import annotations

import time

import asyncpg

from contracts import DeadLetter
from infra.runtime import migrate
from services.app.indexing import index_thread
from services.app.recording import RecordingService
from services.core.ledger import RecordingLimits
from services.store.postgres import PgStore
from tests.fixtures.builders import incoming

from .ingest import ProcessCpu, ingest_events, server_processes

__all__ = ["INDEX_ROUNDS", "INDEX_THREADS", "bench_index_pass"]

INDEX_THREADS = 40
INDEX_ROUNDS = 30


class _NoDeadLetters:
    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        raise AssertionError(f"a sample event was dead-lettered: {letter}")


async def bench_index_pass(database_url: str) -> dict[str, object]:
    """Mean CPU and wall time of an indexer pass over one new record (see the module docstring)."""
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=2, max_size=4)
    try:
        async with pool.acquire() as conn:
            # The PostgreSQL serving this database: its postmaster and backends, nothing else's.
            meter = ProcessCpu({"postgres": (await server_processes(conn))["postgres"]})
        store = PgStore(pool)
        recorder = RecordingService(store, _NoDeadLetters(), limits=RecordingLimits(), recorder_id="bench")
        sessions = ingest_events(INDEX_THREADS, INDEX_ROUNDS, "index")
        threads = [events[0].thread_id for events in sessions]
        seq = 1
        cpu = postgres = wall = 0.0
        for step in range(INDEX_ROUNDS):
            batch = [events[step] for events in sessions]
            await recorder.record_batch(0, incoming(batch, start_seq=seq))
            seq += len(batch)
            cpu_0, pg_0, wall_0 = time.process_time(), meter.sample()["postgres"], time.perf_counter()
            for thread_id in threads:
                await index_thread(store, thread_id)
            cpu += time.process_time() - cpu_0
            postgres += meter.sample()["postgres"] - pg_0
            wall += time.perf_counter() - wall_0
        passes = INDEX_THREADS * INDEX_ROUNDS
        return {
            "passes": passes,
            "records_per_pass": 1,
            "client_cpu_ms": round(cpu / passes * 1000, 3),
            "postgres_cpu_ms": round(postgres / passes * 1000, 3),
            "wall_ms": round(wall / passes * 1000, 3),
        }
    finally:
        await pool.close()
