"""Indexer and search figures: index lag under load, search latency at 100k records, reindex, size.

- lag: ``sessions`` sessions publish tool-call/outcome pairs as fast as the client can; every
  50 ms the backlog (records recorded but not yet indexed) is sampled. Reported: the achieved
  recording rate, the largest backlog, and how long after the last record was recorded the index
  was complete.
- one big session of ``records`` records (over 20 threads): search p50/p99 round trip through
  ``ctx.search`` for rare identifiers, error codes and common words; reindex time of the session;
  index size (chunks table + GIN and b-tree indexes) per MB of recorded text.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

import asyncpg

from contracts import SearchRequest
from infra.runtime import Servers, start_fleet
from ctxfleet_client.client import FleetClient
from services.app.indexing import reindex
from services.store.postgres import PgStore
from services.edge.replay import percentile
from services.settings import Settings
from tests.fixtures.builders import Thread

__all__ = ["bench_index_lag", "bench_search_session"]

_MODULES = (
    "django/db/models/query.py",
    "src/app/server.py",
    "lib/parser/lexer.rs",
    "pkg/api/handler.go",
    "web/src/App.tsx",
)
_CODES = ("E1101", "W0612", "C0301", "TS2345", "E0308")


def _pair(t: Thread, n: int, rng: random.Random) -> list[object]:
    path = _MODULES[n % len(_MODULES)]
    code = _CODES[rng.randrange(len(_CODES))]
    trace = uuid.UUID(int=rng.getrandbits(128))
    output = (
        "".join(
            f"{path}:{rng.randrange(1, 3000)}:{rng.randrange(80)}: "
            f"{code} check failed for value {rng.randrange(10**6)}\n"
            for _ in range(6)
        )
        + f"request {trace} finished with status {rng.choice(('ok', 'error', 'timeout'))}\n"
    )
    return [
        t.assistant(
            f"step {n}: run the linter on {path}",
            calls=((f"c{n}", "bash", {"cmd": f"pylint {path}"}),),
            key=f"a{n}",
        ),
        t.outcome(f"c{n}", output, key=f"o{n}"),
    ]


async def _backlog(conn: asyncpg.Connection, sessions: list[str]) -> tuple[int, int]:
    row = await conn.fetchrow(
        """SELECT COALESCE(sum(h.last_seq), 0) AS recorded,
                  COALESCE(sum(h.last_seq - COALESCE(p.last_seq, 0)), 0) AS behind
           FROM ctx.thread_heads h LEFT JOIN ctx.index_positions p USING (thread_id)
           WHERE h.session_id = ANY($1)""",
        sessions,
    )
    return int(row["recorded"]), int(row["behind"])


async def bench_index_lag(
    servers: Servers, settings: Settings, *, sessions: int = 100, pairs_per_session: int = 100
) -> dict[str, object]:
    """Recording at full speed over many sessions, with the indexer following."""
    fleet = await start_fleet(settings.replace(workers="recorder,assembler,indexer"), servers)
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            rng = random.Random(7)
            threads = [Thread(session_id=f"lag-{uuid.uuid4().hex[:8]}") for _ in range(sessions)]
            events = [[e for n in range(pairs_per_session) for e in _pair(t, n, rng)] for t in threads]
            total = sum(len(es) for es in events)
            ids = [t.session_id for t in threads]
            conn = await asyncpg.connect(servers.database_url)
            max_behind = 0
            samples: list[int] = []
            curve: list[tuple[float, int]] = []  # (when, records recorded by then)
            lags: list[float] = []
            started = time.perf_counter()

            async def publish(es: list[object]) -> None:
                for e in es:
                    await client.append(e)  # type: ignore[arg-type]

            publishing = asyncio.gather(*(publish(es) for es in events))
            recorded_at = indexed_at = 0.0
            while True:
                recorded, behind = await _backlog(conn, ids)
                samples.append(behind)
                max_behind = max(max_behind, behind)
                now = time.perf_counter() - started
                curve.append((now, recorded))
                # How old the newest indexed record is: when was the indexed count first recorded?
                indexed = recorded - behind
                lags.append(now - next(when for when, n in curve if n >= indexed))
                if recorded >= total and not recorded_at:
                    recorded_at = now
                if recorded >= total and behind == 0:
                    indexed_at = now
                    break
                await asyncio.sleep(0.05)
            await publishing
            await conn.close()
    finally:
        await fleet.stop()
    return {
        "events": total,
        "sessions": sessions,
        "recorded_s": round(recorded_at, 2),
        "recorded_events_per_s": round(total / recorded_at, 1),
        "max_backlog_records": max_behind,
        "mean_backlog_records": round(sum(samples) / len(samples), 1),
        "index_complete_after_last_record_s": round(indexed_at - recorded_at, 2),
        "index_lag_p50_s": round(percentile(lags, 50), 2),
        "index_lag_p99_s": round(percentile(lags, 99), 2),
        "index_lag_max_s": round(max(lags), 2),
    }


async def bench_search_session(
    servers: Servers, settings: Settings, *, records: int = 100_000, queries: int = 300
) -> dict[str, object]:
    """One session of ``records`` records: search latency, reindex time, index size per MB."""
    fleet = await start_fleet(settings.replace(workers="recorder,assembler,indexer"), servers)
    session = f"big-{uuid.uuid4().hex[:8]}"
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            rng = random.Random(11)
            # One run per session at a time: its main instance and 19 children.
            run = f"r-{uuid.uuid4().hex[:10]}"
            threads = [Thread(session_id=session, run_id=run)] + [
                Thread(session_id=session, run_id=run, instance_id=f"w{k}", parent_instance_id="main")
                for k in range(1, 20)
            ]
            per = records // 2 // len(threads)
            started = time.perf_counter()

            async def publish(t: Thread) -> None:
                for n in range(per):
                    for e in _pair(t, n, rng):
                        await client.append(e)  # type: ignore[arg-type]

            await client.append(threads[0].user("lint the repository", key="task"))
            await asyncio.gather(*(publish(t) for t in threads))
            conn = await asyncpg.connect(servers.database_url)
            while True:
                recorded, behind = await _backlog(conn, [session])
                if recorded >= per * 2 * len(threads) + 1 and behind == 0:
                    break
                await asyncio.sleep(0.1)
            loaded_s = time.perf_counter() - started
            count = int(await conn.fetchval("SELECT count(*) FROM ctx.records WHERE session_id=$1", session))
            sample = [
                r["text"]
                for r in await conn.fetch(
                    "SELECT text FROM ctx.records WHERE session_id=$1 AND kind='tool_outcome' "
                    "ORDER BY random() LIMIT 50",
                    session,
                )
            ]
            rare = [
                line.split()[1]
                for text in sample
                if text
                for line in text.splitlines()
                if line.startswith("request ")
            ]
            common = ["check failed", "timeout", "linter"]
            mix = [*rare, *_CODES, *_MODULES, *common]
            latencies: list[float] = []
            common_latencies: list[float] = []
            hits = 0
            for i in range(queries):
                t0 = time.perf_counter()
                reply = await client.search(
                    SearchRequest(session_id=session, query=mix[i % len(mix)], limit=20)
                )
                latencies.append((time.perf_counter() - t0) * 1000)
                if mix[i % len(mix)] in common:
                    common_latencies.append(latencies[-1])
                hits += bool(reply.hits)
            text_bytes = int(
                await conn.fetchval(
                    """SELECT sum(COALESCE(octet_length(r.text), octet_length(b.content), 0)
                              + octet_length(r.payload::text))
                   FROM ctx.records r LEFT JOIN ctx.blobs b ON r.text IS NULL AND b.sha256 = r.blob_sha256
                   WHERE r.session_id = $1""",
                    session,
                )
            )
            index_bytes = int(await conn.fetchval("SELECT pg_total_relation_size('ctx.search_chunks')"))
            await fleet.stop()  # the operator's reindex, without the fleet's indexer racing it for the count
            pool = await asyncpg.create_pool(servers.database_url, min_size=1, max_size=5)
            t0 = time.perf_counter()
            reindexed = await reindex(PgStore(pool), session)
            await pool.close()
            reindex_s = time.perf_counter() - t0
            # Deleted chunks stay as dead tuples until autovacuum: the table's size right after.
            reindexed_bytes = int(await conn.fetchval("SELECT pg_total_relation_size('ctx.search_chunks')"))
            await conn.close()
    finally:
        await fleet.stop()
    return {
        "records": count,
        "load_and_index_s": round(loaded_s, 1),
        "queries": queries,
        "queries_with_hits": hits,
        "search_p50_ms": round(percentile(latencies, 50), 1),
        "search_p99_ms": round(percentile(latencies, 99), 1),
        # words in every second record: ranked among the 2,000 most recent matches
        "common_word_queries": len(common_latencies),
        "common_word_p50_ms": round(percentile(common_latencies, 50), 1),
        "common_word_p99_ms": round(percentile(common_latencies, 99), 1),
        "reindexed_records": reindexed,
        "reindex_s": round(reindex_s, 2),
        "recorded_mb": round(text_bytes / 1e6, 1),
        "index_mb": round(index_bytes / 1e6, 1),
        "index_mb_per_recorded_mb": round(index_bytes / text_bytes, 2),
        "index_mb_after_reindex": round(reindexed_bytes / 1e6, 1),
    }
