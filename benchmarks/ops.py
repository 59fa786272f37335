"""Operations figures: start-to-ready per worker, SIGTERM drain time under load, idle memory per worker.

Each worker runs as the image runs it (`ctxfleet worker NAME`, one process) against real servers.
Start-to-ready is from process spawn to the first 200 on /readyz (so it includes the interpreter, imports, the
migration and provisioning checks, connecting and binding consumers). Idle memory is VmRSS after 3 s ready
with no traffic. Drain time is SIGTERM to exit while small-budget (6,000-token) replays keep every worker busy
(recording, prepares, compactions, indexing); each drained worker is restarted so the load continues, and the
bench then checks that every replayed event was recorded exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
from collections import Counter
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import asyncpg

from contracts import ContextPolicy
from infra import SAMPLES_DIR
from infra.embedded import free_port
from ctxfleet_client.client import FleetClient
from services.edge.replay import ReplayOptions, replay_trace
from infra.runtime import migrate, provision
from services.settings import WORKER_NAMES, Settings, parse_nats_urls
from services.core.trace import read_trace

__all__ = ["bench_ops"]

ROOT = Path(__file__).resolve().parents[1]
_CTXFLEET = Path(sys.executable).parent / "ctxfleet"


class _Worker:
    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.name = name
        self.port = free_port()
        self.started = time.perf_counter()
        command = [str(_CTXFLEET)] if _CTXFLEET.exists() else [sys.executable, "-m", "infra.cli"]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [*command, "worker", name],
                cwd=ROOT,
                env={**env, "CTX_HTTP_PORT": str(self.port)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def ready_after(self, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as reply:
                    if reply.status == 200:
                        return time.perf_counter() - self.started
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.01)
        raise RuntimeError(f"{self.name} not ready within {timeout}s")

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def drain(self) -> tuple[int, float]:
        started = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        return code, time.perf_counter() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def bench_ops(
    nats_url: str, database_url: str, tmp: Path, *, rounds: int = 3, sessions: int = 24
) -> dict[str, object]:
    """Start-to-ready, idle RSS and drain-under-load figures for every worker kind."""
    # What the migration Job does once; workers never migrate or provision.
    await migrate(database_url)
    await provision(
        parse_nats_urls(nats_url),
        Settings(nats_url=nats_url, database_url=database_url, data_dir=tmp / "data"),
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(
        CTX_NATS_URL=nats_url,
        CTX_DATABASE_URL=database_url,
        CTX_DATA_DIR=str(tmp / "data"),
        CTX_LOG_LEVEL="INFO",
    )
    logs = tmp / "ops-logs"
    logs.mkdir(exist_ok=True)
    ready: dict[str, list[float]] = {name: [] for name in WORKER_NAMES}
    rss: dict[str, list[float]] = {name: [] for name in WORKER_NAMES}
    for _ in range(rounds):
        for name in WORKER_NAMES:
            worker = _Worker(name, env, logs / f"{name}.log")
            try:
                ready[name].append(await asyncio.to_thread(worker.ready_after))
                await asyncio.sleep(3.0)
                rss[name].append(worker.rss_mb())
                await asyncio.to_thread(worker.drain)
            finally:
                worker.kill()

    # Under load: all five running, replays in flight, each worker drained (and replaced) in turn.
    # A second assembler serves prepares while the first drains, as two replicas and a PDB do in k8s.
    fleet = {name: _Worker(name, env, logs / f"{name}.log") for name in WORKER_NAMES}
    spare = _Worker("assembler", env, logs / "assembler-2.log")
    drains: dict[str, dict[str, float | int]] = {}
    try:
        for worker in [*fleet.values(), spare]:
            await asyncio.to_thread(worker.ready_after)
        traces = sorted(SAMPLES_DIR.glob("*.jsonl"))
        async with await FleetClient.connect(nats_url, name="ops-bench") as client:
            policy = ContextPolicy(name="ops-6000", model_profile=None, budget_tokens=6000)
            await client.register_policy(policy)
            lines_by_trace = [read_trace(t) for t in traces]

            error_codes: Counter[str] = Counter()

            async def replay(i: int) -> int:
                lines = lines_by_trace[i % len(lines_by_trace)]
                options = ReplayOptions(session_id=f"ops-{i}", policy=policy.name)
                report = await replay_trace(client, lines, options)
                error_codes.update(str(p["error"]).split(":")[0] for p in report.prepares if "error" in p)
                errors = report.totals.get("errors", 0)
                return int(errors) if isinstance(errors, int) else 0

            load = asyncio.gather(*(replay(i) for i in range(sessions)), return_exceptions=True)
            await asyncio.sleep(2.0)
            for name in WORKER_NAMES:
                loaded_rss = fleet[name].rss_mb()
                code, took = await asyncio.to_thread(fleet[name].drain)
                drains[name] = {
                    "drain_s": round(took, 3),
                    "exit_code": code,
                    "rss_before_mb": round(loaded_rss, 1),
                }
                fleet[name] = _Worker(name, env, logs / f"{name}.log")
                await asyncio.to_thread(fleet[name].ready_after)
                await asyncio.sleep(1.0)
            outcomes = await load
        replay_errors = sum(o for o in outcomes if isinstance(o, int))
        failed = [repr(o) for o in outcomes if isinstance(o, BaseException)]
        expected_events = sum(len(lines_by_trace[i % len(lines_by_trace)]) for i in range(sessions))
        conn = await asyncpg.connect(database_url)
        try:
            deadline = time.monotonic() + 30
            while True:
                recorded = int(
                    await conn.fetchval("SELECT count(*) FROM ctx.records WHERE session_id LIKE 'ops-%'")
                )
                if recorded >= expected_events or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            distinct = int(
                await conn.fetchval(
                    "SELECT count(DISTINCT (thread_id, event_key)) FROM ctx.records "
                    "WHERE session_id LIKE 'ops-%'"
                )
            )
        finally:
            await conn.close()
    finally:
        for worker in [*fleet.values(), spare]:
            worker.kill()
    return {
        "start_to_ready_s": {
            n: {"median": round(statistics.median(v), 2), "max": round(max(v), 2)} for n, v in ready.items()
        },
        "idle_rss_mb": {n: round(statistics.median(v), 1) for n, v in rss.items()},
        "drain_under_load": drains,
        "load": {
            "sessions": sessions,
            "replay_errors": replay_errors,
            # Refusals a budget this small causes anyway (pinned content alone exceeds it)
            # are not drain losses.
            "replay_errors_by_code": dict(error_codes),
            "replays_failed": failed,
            # Run-closing events the replay adds are counted in the ledger too: at least, never fewer.
            "events_replayed_at_least": expected_events,
            "records": recorded,
            "records_distinct": distinct,
        },
    }


if __name__ == "__main__":
    print(json.dumps({"usage": "python -m benchmarks.run --only ops"}))
