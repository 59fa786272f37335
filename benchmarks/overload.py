"""Overload figures: 300 concurrent prepare loops against one assembler process for a bounded time.

The recorder and assembler run as one worker process (``ctxfleet worker recorder assembler``), as
in a deployment, so the load generator here does not share its event loop. Each loop prepares one
of a few threads (built with the test builders) over and over; a loop answered ``overloaded``
waits the reply's ``retry_after_ms`` (with jitter) and tries again, as a runtime should.

Figures per configuration: admitted prepares, their p50/p99 round trip, the share of attempts
answered ``overloaded``, and timeouts (which must be 0: overload is answered, never left to time
out). ``admission`` uses the default limits; ``unbounded`` sets limits no burst reaches, which is
how the assembler behaved without admission control (every request admitted, queueing hidden).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from contracts import PrepareRequest
from .fleet_process import spawn_worker, wait_ready
from infra.runtime import migrate, provision
from ctxfleet_client.client import FleetClient
from contracts.exceptions import FleetUnavailable, Overloaded
from services.edge.replay import percentile
from services.settings import Settings, parse_nats_urls
from tests.fixtures.builders import Thread

__all__ = ["bench_overload"]

ROOT = Path(__file__).resolve().parents[1]
_CTXFLEET = Path(sys.executable).parent / "ctxfleet"
_CONFIGS = {
    "admission": {},
    "unbounded": {"CTX_MAX_INFLIGHT_REQUESTS": "4096", "CTX_MAX_QUEUE_AGE_MS": "60000"},
}


def _server_quantiles(port: int) -> dict[str, float]:
    """Server-side p50/p99 (bucket upper bounds) of prepare time and admission queue time, from /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out: dict[str, float] = {}
    for metric, key in (
        ("ctx_prepare_seconds", "server_prepare"),
        ("ctx_request_queue_seconds", "server_queue"),
    ):
        buckets: dict[float, float] = {}
        for line in text.splitlines():
            if line.startswith(f"{metric}_bucket{{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                bound = float("inf") if le == "+Inf" else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
        total = buckets.get(float("inf"), 0.0)
        for pct in (50, 99):
            bound = next((b for b in sorted(buckets) if total and buckets[b] >= total * pct / 100), 0.0)
            out[f"{key}_p{pct}_le_ms"] = bound * 1000
    return out


async def _seed(client: FleetClient, threads: int, events: int) -> list[PrepareRequest]:
    requests = []
    for _ in range(threads):
        t = Thread(session_id=f"overload-{uuid.uuid4().hex[:8]}")
        for i in range(events):
            await client.append(t.user(f"question {i} about the parser " + "context " * 40, key=f"e{i}"))
        request = PrepareRequest(
            session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, model_profile="gpt-4o"
        )
        await client.prepare(
            request.model_copy(update={"after_event_key": f"e{events - 1}", "wait_ms": 30_000})
        )
        requests.append(request)
    return requests


async def _load(
    client: FleetClient, requests: list[PrepareRequest], loops: int, seconds: float
) -> dict[str, float | int]:
    admitted: list[float] = []
    overloaded = timeouts = 0
    stop_at = time.monotonic() + seconds
    rng = random.Random(7)

    async def loop(i: int) -> None:
        nonlocal overloaded, timeouts
        request = requests[i % len(requests)]
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            try:
                await client.prepare(request, timeout=10.0)
            except Overloaded as exc:
                overloaded += 1
                await asyncio.sleep(exc.retry_after_ms / 1000 * rng.uniform(0.5, 1.5))
                continue
            except FleetUnavailable:
                timeouts += 1
                continue
            admitted.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(loop(i) for i in range(loops)))
    attempts = len(admitted) + overloaded + timeouts
    return {
        "admitted": len(admitted),
        "admitted_per_s": round(len(admitted) / seconds, 1),
        "p50_ms": round(percentile(admitted, 50), 1),
        "p99_ms": round(percentile(admitted, 99), 1),
        "overloaded": overloaded,
        "overloaded_share": round(overloaded / attempts, 3) if attempts else 0.0,
        "timeouts": timeouts,
    }


async def bench_overload(
    nats_url: str,
    database_url: str,
    tmp: Path,
    *,
    loops: int = 300,
    seconds: float = 20.0,
    threads: int = 6,
    events: int = 40,
) -> dict[str, object]:
    """Admitted p50/p99 and the overloaded share under ``loops`` concurrent prepare loops,
    per configuration."""
    await migrate(database_url)
    await provision(
        parse_nats_urls(nats_url),
        Settings(nats_url=nats_url, database_url=database_url, data_dir=tmp / "data"),
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    base.update(CTX_NATS_URL=nats_url, CTX_DATABASE_URL=database_url, CTX_DATA_DIR=str(tmp / "data"))
    results: dict[str, object] = {
        "loops": loops,
        "seconds": seconds,
        "threads": threads,
        "events_per_thread": events,
    }
    for name, overrides in _CONFIGS.items():
        proc, port = spawn_worker(
            {**base, **overrides}, ("recorder", "assembler"), tmp / f"overload-{name}.log"
        )
        try:
            await asyncio.to_thread(wait_ready, proc, port)
            async with await FleetClient.connect(nats_url, name=f"overload-{name}") as client:
                requests = await _seed(client, threads, events)
                figures = await _load(client, requests, loops, seconds)
                results[name] = {**figures, **await asyncio.to_thread(_server_quantiles, port)}
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return results
