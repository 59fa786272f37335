"""Memory of an all-in-one fleet process under 1,000 sessions.

All five workers run in one process (``ctxfleet worker …``); ``sessions`` sessions (1,000), at most
``parallel`` at a time, each record ``events`` events (~20, from the bundled samples) and prepare
once; then every session is prepared once more (the caches' eviction path). ``VmRSS`` of the fleet
process is sampled every ``interval_s`` from start to end. Figures: idle RSS after start, the peak,
the plateau (median of the samples of the last ``plateau_s`` seconds, the fleet idle after the
load), and RSS after each tenth of the sessions — bounded caches flatten that curve, unbounded ones
grow it with the sessions.

The view cache setting is taken from this environment and handed to the fleet: every ``CTX_*CACHE*``
variable set here (e.g. ``CTX_VIEW_CACHE_MB=64 make bench BENCH_ARGS="--only memory"``) is named in
the result; none set means the build's defaults (each cache bounded by a count of threads).

``make bench BENCH_ARGS="--only memory"``
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
import uuid
from pathlib import Path

from contracts import PrepareRequest
from ctxfleet_client.client import FleetClient
from services.edge.replay import percentile

from .conversation import sample_events
from .fleet_process import ALL_WORKERS, FleetProcess, fleet_env, prepare_servers

__all__ = ["bench_memory", "cache_settings"]


def cache_settings() -> dict[str, str]:
    """The cache settings of this environment the fleet is given (``CTX_*CACHE*``)."""
    return {k: v for k, v in os.environ.items() if k.startswith("CTX_") and "CACHE" in k}


class _Sampler:
    """``VmRSS`` of the fleet every ``interval`` seconds, on a thread (the event loop may be busy)."""

    def __init__(self, fleet: FleetProcess, interval: float) -> None:
        self.samples: list[tuple[float, float]] = []
        self._fleet, self._interval = fleet, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self._t0, self._fleet.rss_mb()))
            self._stop.wait(self._interval)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def since(self, t: float) -> list[float]:
        return [rss for at, rss in self.samples if at >= t]

    def now(self) -> float:
        return time.monotonic() - self._t0


async def bench_memory(
    nats_url: str,
    database_url: str,
    tmp: Path,
    *,
    sessions: int = 1_000,
    events: int = 20,
    parallel: int = 20,
    interval_s: float = 0.25,
    plateau_s: float = 5.0,
) -> dict[str, object]:
    """Peak and plateau RSS of an all-in-one fleet while ``sessions`` sessions record and prepare."""
    await prepare_servers(nats_url, database_url, tmp / "data")
    caches = cache_settings()
    env = fleet_env(nats_url, database_url, tmp / "data", **caches)
    with FleetProcess(ALL_WORKERS, env, tmp / "memory.log") as fleet:
        await asyncio.sleep(2.0)  # start-up allocations settle (tokenizer tables, imports)
        idle = fleet.rss_mb()
        sampler = _Sampler(fleet, interval_s)
        sampler.start()
        progress: list[float] = []
        latencies: list[float] = []
        requests: list[PrepareRequest] = []
        try:
            async with await FleetClient.connect(nats_url, name="memory") as client:
                gate = asyncio.Semaphore(parallel)
                done = 0

                async def session(i: int) -> None:
                    nonlocal done
                    async with gate:
                        thread = sample_events(f"mem-{uuid.uuid4().hex[:10]}", events, start=i)
                        for event in thread:
                            await client.append(event)
                        last = thread[-1]
                        request = PrepareRequest(
                            session_id=last.session_id,
                            run_id=last.run_id,
                            instance_id=last.instance_id,
                            model_profile="gpt-4o",
                        )
                        started = time.perf_counter()
                        await client.prepare(
                            request.model_copy(update={"after_event_key": last.event_key, "wait_ms": 60_000}),
                            timeout=90,
                        )
                        latencies.append((time.perf_counter() - started) * 1000)
                        requests.append(request)
                        done += 1
                        if done % max(1, sessions // 10) == 0:
                            progress.append(round(fleet.rss_mb(), 1))

                await asyncio.gather(*(session(i) for i in range(sessions)))
                after_first = fleet.rss_mb()

                async def again(request: PrepareRequest) -> None:
                    async with gate:
                        await client.prepare(request, timeout=90)

                await asyncio.gather(*(again(r) for r in requests))
            quiet_from = sampler.now()
            await asyncio.sleep(plateau_s)
        finally:
            sampler.stop()
        plateau = sampler.since(quiet_from)
        every = [rss for _, rss in sampler.samples]
    return {
        "sessions": sessions,
        "events_per_session": events,
        "parallel": parallel,
        "cache_settings": caches or "defaults (CTX_VIEW_CACHE_MB=256, one byte-bounded view cache)",
        "rss_idle_mb": round(idle, 1),
        "rss_peak_mb": round(max(every), 1),
        "rss_plateau_mb": round(statistics.median(plateau), 1) if plateau else None,
        "rss_after_first_pass_mb": round(after_first, 1),
        "rss_by_tenth_of_sessions_mb": progress,
        "samples": len(every),
        "prepare_p50_ms": round(percentile(latencies, 50), 1),
        "prepare_p99_ms": round(percentile(latencies, 99), 1),
    }
