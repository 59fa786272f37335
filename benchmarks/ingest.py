"""Ingest figures: 100 sessions × 100 realistic events, publish → in PostgreSQL, per worker set.

The events come from the bundled samples (each session concatenates the six traces from a rotated
start, one run per trace, so tool calls, outcomes, long outputs and run ends all occur), cut to
``per_session`` events. The workers run as ``ctxfleet worker …`` processes, as deployed, so the
publisher here does not share their event loop or core: one process per set, but ``two_recorders``,
where the recorder is scaled out by partition (``CTX_RECORDER_PARTITIONS`` 0/2 and 1/2) across the
two cores, the assembler beside the first.

Two figures per worker set, each the median of ``runs`` fresh databases:
- ``burst``: every session publishes concurrently (pipelined asynchronous publish acks over a few
  connections; a session stays on one connection, so its order is kept); events/s from the first
  publish to the last record in PostgreSQL. Bounded by whichever is slower, publishing (with
  ``sync_always`` the broker fsyncs each message) or recording.
- ``backlog``: the same events published first with no worker running, then the worker started;
  events/s from the first record to the last. The recorder's own rate, whatever publishing costs.

Per run: CPU seconds of the worker process, PostgreSQL (all backends), nats-server and this
publisher, over the measured window; and a check that every session's records are in the order its
events were published (``order_violations`` must be 0). ``--profile`` adds the top functions of the
worker process by py-spy (needs ``py-spy`` in the venv and ptrace rights).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import asyncpg
import nats
import psutil

from contracts import Event
from contracts.subjects import EVENTS_STREAM, events_subject, msg_id_of
from infra import SAMPLES_DIR
from .fleet_process import spawn_worker, wait_ready
from infra.runtime import migrate, provision
from services.core.trace import TraceLine, read_trace
from services.edge.replay import ReplayOptions, trace_events
from services.settings import Settings, parse_nats_urls

__all__ = ["ProcessCpu", "bench_ingest", "ingest_events", "server_processes"]

ROOT = Path(__file__).resolve().parents[1]
_CTXFLEET = Path(sys.executable).parent / "ctxfleet"
_PUBLISHERS = 4
_PENDING = 2_000
# A set is its processes: each the workers it runs and the partitions its recorder owns.
WORKER_SETS: dict[str, tuple[tuple[tuple[str, ...], str], ...]] = {
    "recorder_assembler": ((("recorder", "assembler"), "all"),),
    "all_five": ((("recorder", "assembler", "budgeter", "compactor", "indexer"), "all"),),
    # The recorder scaled out by partition (CTX_RECORDER_PARTITIONS i/2), one process per core.
    "two_recorders": ((("recorder", "assembler"), "0/2"), (("recorder",), "1/2")),
}


def ingest_events(sessions: int, per_session: int, tag: str) -> list[list[Event]]:
    """``per_session`` events for each of ``sessions`` sessions, built from the bundled samples."""
    traces = [read_trace(p) for p in sorted(SAMPLES_DIR.glob("*.jsonl"))]
    out: list[list[Event]] = []
    for s in range(sessions):
        lines: list[TraceLine] = []
        for k in range(len(traces)):
            trace = traces[(s + k) % len(traces)]
            # One run per trace: its own thread, so call ids of two traces never meet.
            lines += [dataclasses.replace(line, run=f"t{k}-{line.run}") for line in trace]
        events = trace_events(lines, ReplayOptions(session_id=f"ing{tag}s{s}"))
        out.append(events[:per_session])
    return out


async def _publish_all(nats_url: str, sessions: Sequence[Sequence[Event]]) -> float:
    """Publish every session concurrently; seconds until the last ack."""
    conns = [
        await nats.connect(list(parse_nats_urls(nats_url)), name=f"ingest-pub-{i}")
        for i in range(_PUBLISHERS)
    ]
    try:
        streams = [nc.jetstream(publish_async_max_pending=_PENDING) for nc in conns]
        encoded = [
            [
                (events_subject("default", e.session_id, e.thread_id), e, e.model_dump_json().encode())
                for e in events
            ]
            for events in sessions
        ]
        started = time.perf_counter()

        async def session(i: int) -> None:
            js = streams[i % len(streams)]
            futures = [
                await js.publish_async(
                    subject, data, headers={"Nats-Msg-Id": msg_id_of(e.thread_id, e.event_key, data)}
                )
                for subject, e, data in encoded[i]
            ]
            for ack in await asyncio.gather(*futures):
                assert ack.stream == EVENTS_STREAM

        await asyncio.gather(*(session(i) for i in range(len(encoded))))
        return time.perf_counter() - started
    finally:
        for nc in conns:
            await nc.close()


class ProcessCpu:
    """CPU seconds of named process groups between two samples."""

    def __init__(self, groups: dict[str, list[psutil.Process]]) -> None:
        self._groups = groups
        self._start = self.sample()

    def sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, procs in self._groups.items():
            total = 0.0
            for p in procs:
                try:
                    members = [p, *p.children(recursive=True)] if name == "postgres" else [p]
                    for m in members:
                        t = m.cpu_times()
                        total += t.user + t.system
                except psutil.Error:
                    continue
            out[name] = total
        return out

    def seconds(self) -> dict[str, float]:
        end = self.sample()
        return {k: round(end[k] - self._start.get(k, 0.0), 2) for k in end}


async def server_processes(conn: asyncpg.Connection) -> dict[str, list[psutil.Process]]:
    """The embedded nats-server (our child) and the PostgreSQL postmaster serving ``conn``."""
    nats_procs = [p for p in psutil.Process().children(recursive=True) if p.name() == "nats-server"]
    backend = psutil.Process(int(await conn.fetchval("SELECT pg_backend_pid()")))
    postmaster = backend.parent()
    return {"nats": nats_procs, "postgres": [postmaster] if postmaster is not None else []}


async def _count(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM ctx.records"))


async def _order_violations(conn: asyncpg.Connection, sessions: Sequence[Sequence[Event]]) -> int:
    """Sessions whose records, in session order, are not in the order their events were published."""
    rows = await conn.fetch("SELECT session_id, thread_id, event_key FROM ctx.records ORDER BY session_seq")
    got: dict[str, list[tuple[str, str]]] = {}
    for r in rows:
        got.setdefault(r["session_id"], []).append((r["thread_id"], r["event_key"]))
    bad = 0
    for events in sessions:
        want = [(e.thread_id, e.event_key) for e in events]
        bad += got.get(events[0].session_id) != want
    return bad


async def _profile(pid: int, seconds: float, out: Path) -> list[str]:
    """The worker's top functions (own + children %) over ``seconds``, by py-spy."""
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        return ["py-spy not installed in the venv"]
    raw = out.with_suffix(".txt")
    proc = await asyncio.create_subprocess_exec(
        str(spy),
        "record",
        "-p",
        str(pid),
        "-d",
        str(int(seconds)),
        "-r",
        "200",
        "-f",
        "raw",
        # Every thread on a CPU (py-spy leaves out idle ones, a thread waiting for the GIL included), not
        # only the one holding the GIL: tiktoken lets it go while it encodes, and `--gil` hid the count.
        "-o",
        str(raw),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    await proc.wait()
    if not raw.exists():
        return ["py-spy failed (ptrace?)"]
    own: dict[str, int] = {}
    total_of: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = [f.split(" (")[0] for f in stack.split(";")]
        samples += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            total_of[f] = total_of.get(f, 0) + n
    top = sorted(total_of.items(), key=lambda kv: -kv[1])
    keep = [f for f in top if not f[0].startswith(("<module>", "run", "_run_once", "run_forever", "main"))]
    by_self = sorted(own.items(), key=lambda kv: -kv[1])[:15]
    return [
        *(
            f"{100 * n / samples:5.1f}% total {100 * own.get(name, 0) / samples:5.1f}% self {name}"
            for name, n in keep[:25]
        ),
        *(f"{100 * n / samples:5.1f}% self {name}" for name, n in by_self),
    ]


async def _one_run(
    nats_url: str,
    pg_url: str,
    tmp: Path,
    processes: Sequence[tuple[tuple[str, ...], str]],
    sessions: Sequence[Sequence[Event]],
    *,
    backlog: bool,
    profile: bool,
    fresh_database: object,
    reset_streams: object,
) -> dict[str, object]:
    db: str = await fresh_database(pg_url)  # type: ignore[operator]
    await reset_streams(nats_url)  # type: ignore[operator]
    await migrate(db)
    await provision(
        parse_nats_urls(nats_url), Settings(nats_url=nats_url, database_url=db, data_dir=tmp / "data")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(CTX_NATS_URL=nats_url, CTX_DATABASE_URL=db, CTX_DATA_DIR=str(tmp / "data"))
    total = sum(len(s) for s in sessions)
    conn = await asyncpg.connect(db)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        publish_s = 0.0
        if backlog:
            publish_s = await _publish_all(nats_url, sessions)
        ports = []
        for i, (workers, partitions) in enumerate(processes):
            proc, port = spawn_worker(
                {**env, "CTX_RECORDER_PARTITIONS": partitions}, workers, tmp / f"ingest-worker-{i}.log"
            )
            procs.append(proc)
            ports.append(port)
        servers = await server_processes(conn)
        workers_cpu = [psutil.Process(p.pid) for p in procs]
        groups = {"worker": workers_cpu, "publisher": [psutil.Process()], **servers}
        if not backlog:
            for proc, port in zip(procs, ports, strict=True):
                await asyncio.to_thread(wait_ready, proc, port)
        if backlog:
            while (first := await _count(conn)) == 0:
                await asyncio.sleep(0.005)
        cpu = ProcessCpu(groups)
        started = time.perf_counter()
        # From the first record (backlog) or the first publish (burst): start-up is not profiled.
        spy = asyncio.create_task(_profile(procs[0].pid, 2, tmp / "spy")) if profile else None
        if not backlog:
            first = 0
            publish_s = await _publish_all(nats_url, sessions)
        while (n := await _count(conn)) < total:
            if time.perf_counter() - started > 300:
                raise RuntimeError(f"only {n} of {total} events recorded after 300 s")
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - started
        seconds = cpu.seconds()
        result: dict[str, object] = {
            "events": total,
            "events_per_s": round((total - first) / elapsed, 1),
            "elapsed_s": round(elapsed, 3),
            "publish_s": round(publish_s, 3),
            "published_per_s": round(total / publish_s, 1) if publish_s else None,
            "cpu_s": seconds,
            "cpu_cores": {k: round(v / elapsed, 2) for k, v in seconds.items()},
            "order_violations": await _order_violations(conn, sessions),
        }
        if spy is not None:
            result["py_spy_top"] = await spy
        return result
    finally:
        await conn.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def bench_ingest(
    nats_url: str,
    pg_url: str,
    *,
    fresh_database: object,
    reset_streams: object,
    sessions: int = 100,
    per_session: int = 100,
    runs: int = 3,
    profile: bool = False,
    sets: Sequence[str] = tuple(WORKER_SETS),
) -> dict[str, object]:
    """Median burst and backlog events/s per worker set (see the module docstring)."""
    tmp = Path(tempfile.mkdtemp(prefix="ctx-ingest-"))
    results: dict[str, object] = {"sessions": sessions, "events_per_session": per_session, "runs": runs}
    try:
        for set_name in sets:
            workers = WORKER_SETS[set_name]
            per_mode: dict[str, object] = {}
            for mode in ("burst", "backlog"):
                measured = []
                for r in range(runs):
                    events = ingest_events(sessions, per_session, f"{set_name[:3]}{mode[:2]}{r}")
                    measured.append(
                        await _one_run(
                            nats_url,
                            pg_url,
                            tmp,
                            workers,
                            events,
                            backlog=mode == "backlog",
                            profile=profile and r == 0,
                            fresh_database=fresh_database,
                            reset_streams=reset_streams,
                        )
                    )
                rates = [float(m["events_per_s"]) for m in measured]  # type: ignore[arg-type]
                per_mode[mode] = {
                    "median_events_per_s": statistics.median(rates),
                    "events_per_s": rates,
                    "runs": measured,
                }
            results[set_name] = per_mode
        return results
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
