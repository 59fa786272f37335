"""Prepare throughput under concurrency: an open-loop schedule against a fleet process.

``sessions`` sessions (50 by default) each hold one thread of ``records`` records (50) built from the
bundled samples. The fleet runs in its own process (``ctxfleet worker …``): all five workers, then
recorder + assembler only. The load generator is this process, so it never shares the fleet's event
loop; its CPU share is reported beside the fleet's, so a figure shows which one was the bound.

- ``open_loop``: for each rate of ``rates`` (prepares/s) for ``seconds`` each, a prepare of the next
  session (round robin over a few client connections) is sent at its scheduled instant whether or
  not the earlier ones were answered — a closed loop would slow down with the fleet and hide its
  queueing. Per rate: prepares sent, answered per second, p50/p99/max round trip, ``overloaded``
  answers, timeouts, how late the generator sent (schedule lag p99), CPU cores used by the fleet
  process, by the generator, and by the whole machine (servers and any other work on it).
  Goal: ≥ 300 prepares/s sustained with p99 ≤ 50 ms.
- ``agent``: each session alternates publish its thread's next event → prepare naming it
  (``after_event_key``) → think pause (``think_s``), for ``agent_seconds``; sessions start spread
  over one pause. Publish → reply p50/p99/max.

``make bench BENCH_ARGS="--only concurrency"`` (``--sessions``, ``--rates``, ``--rate-seconds``,
``--think-s`` change the shape).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from contracts import Event, PrepareRequest
from ctxfleet_client.client import FleetClient
from services.edge.replay import percentile
from contracts.exceptions import FleetUnavailable, Overloaded

from .conversation import publish_thread, sample_events
from .fleet_process import ALL_WORKERS, CpuMeter, FleetProcess, MachineCpu, fleet_env, prepare_servers

__all__ = ["AgentSteps", "Session", "agent_figures", "agent_steps", "bench_concurrency", "seed_sessions"]

_CLIENTS = 4
_TIMEOUT_S = 5.0
_CONFIGS: dict[str, tuple[str, ...]] = {
    "all_workers": ALL_WORKERS,
    "recorder_and_assembler": ("recorder", "assembler"),
}


@dataclass
class Session:
    request: PrepareRequest
    ahead: list[Event]  # the thread's next events, for the agent-like mode, consumed as published


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50), 2),
        "p99_ms": round(percentile(values, 99), 2),
        "max_ms": round(max(values), 2) if values else 0.0,
    }


async def seed_sessions(clients: list[FleetClient], sessions: int, records: int) -> list[Session]:
    """Publish every session's thread, then wait until each one's last event is readable."""

    async def one(i: int) -> Session:
        client = clients[i % len(clients)]
        events = sample_events(f"conc-{uuid.uuid4().hex[:10]}", records + 200, start=i)
        head, ahead = events[:records], events[records:]
        return Session(await publish_thread(client, head), ahead)

    gate = asyncio.Semaphore(10)

    async def bounded(i: int) -> Session:
        async with gate:
            return await one(i)

    return list(await asyncio.gather(*(bounded(i) for i in range(sessions))))


async def _open_loop(
    clients: list[FleetClient], sessions: list[Session], rate: float, seconds: float, fleet: FleetProcess
) -> dict[str, object]:
    latencies: list[float] = []
    lags: list[float] = []
    counts = {"overloaded": 0, "timeouts": 0, "errors": 0}
    total = int(rate * seconds)
    tasks: list[asyncio.Task[None]] = []

    async def one(n: int) -> None:
        started = time.perf_counter()
        try:
            await clients[n % len(clients)].prepare(sessions[n % len(sessions)].request, timeout=_TIMEOUT_S)
        except Overloaded:
            counts["overloaded"] += 1
            return
        except FleetUnavailable:
            counts["timeouts"] += 1
            return
        except Exception:
            counts["errors"] += 1
            return
        latencies.append((time.perf_counter() - started) * 1000)

    fleet_cpu, own_cpu, machine = fleet.cpu(), CpuMeter(psutil.Process(os.getpid())), MachineCpu()
    fleet_cpu.start()
    own_cpu.start()
    machine.start()
    t0 = time.perf_counter()
    for n in range(total):
        due = t0 + n / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        lags.append((time.perf_counter() - due) * 1000)
        tasks.append(asyncio.create_task(one(n)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - t0
    return {
        "target_per_s": rate,
        "sent": total,
        "answered": len(latencies),
        "answered_per_s": round(len(latencies) / elapsed, 1),
        **_ms(latencies),
        **counts,
        "schedule_lag_p99_ms": round(percentile(lags, 99), 2),
        "fleet_cpu_cores": fleet_cpu.stop(),
        "generator_cpu_cores": own_cpu.stop(),
        "machine_busy_cores": machine.stop(),
    }


@dataclass
class AgentSteps:
    """Raw figures of agent-like steps: whole steps, and their two halves apart — the publish ack,
    and the prepare that waits for the event."""

    steps: list[float] = field(default_factory=list)
    publishes: list[float] = field(default_factory=list)
    prepares: list[float] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {"overloaded": 0, "timeouts": 0, "errors": 0})


async def agent_steps(
    clients: list[FleetClient], sessions: list[Session], think_s: float, seconds: float, into: AgentSteps
) -> None:
    """For ``seconds``, each session publishes its next event, prepares naming it, then thinks.

    Sessions start spread over one pause. Each session's events are consumed, so a later call goes on
    where this one stopped (a repeated event would be a duplicate, answered without waiting)."""
    stop_at = time.monotonic() + seconds
    rng = random.Random(16)

    async def agent(i: int, session: Session) -> None:
        client = clients[i % len(clients)]
        await asyncio.sleep(rng.uniform(0, think_s))
        while session.ahead and time.monotonic() < stop_at:
            event = session.ahead.pop(0)
            started = time.perf_counter()
            try:
                await client.append(event)
                acked = time.perf_counter()
                await client.prepare(
                    session.request.model_copy(update={"after_event_key": event.event_key, "wait_ms": 5_000}),
                    timeout=_TIMEOUT_S + 5,
                )
                done = time.perf_counter()
                into.steps.append((done - started) * 1000)
                into.publishes.append((acked - started) * 1000)
                into.prepares.append((done - acked) * 1000)
            except Overloaded:
                into.counts["overloaded"] += 1
            except FleetUnavailable:
                into.counts["timeouts"] += 1
            except Exception:
                into.counts["errors"] += 1
            await asyncio.sleep(think_s)

    await asyncio.gather(*(agent(i, s) for i, s in enumerate(sessions)))


def agent_figures(run: AgentSteps, elapsed_s: float) -> dict[str, object]:
    return {
        "steps": len(run.steps),
        "steps_per_s": round(len(run.steps) / elapsed_s, 1),
        **_ms(run.steps),
        "publish": _ms(run.publishes),
        "prepare": _ms(run.prepares),
        **run.counts,
    }


async def _agent_like(
    clients: list[FleetClient], sessions: list[Session], think_s: float, seconds: float, fleet: FleetProcess
) -> dict[str, object]:
    fleet_cpu, own_cpu, machine = fleet.cpu(), CpuMeter(psutil.Process(os.getpid())), MachineCpu()
    fleet_cpu.start()
    own_cpu.start()
    machine.start()
    t0 = time.perf_counter()
    run = AgentSteps()
    await agent_steps(clients, sessions, think_s, seconds, run)
    return {
        "think_s": think_s,
        **agent_figures(run, time.perf_counter() - t0),
        "fleet_cpu_cores": fleet_cpu.stop(),
        "generator_cpu_cores": own_cpu.stop(),
        "machine_busy_cores": machine.stop(),
    }


_SLOW = {
    "ctx_record_batch_seconds": "record_batches",
    "ctx_gc_pause_seconds": "gc_pauses",
}


def _slow_counts(fleet: FleetProcess) -> dict[str, dict[str, float]]:
    """Per histogram: how many observations there were, and how many took over 0.1 s and 0.25 s."""
    text = fleet.metrics()
    out: dict[str, dict[str, float]] = {}
    for metric, label in _SLOW.items():
        buckets: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(f"{metric}_bucket{{"):
                le = line.split('le="', 1)[1].split('"', 1)[0]
                buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
        total = buckets.get("+Inf", 0.0)
        out[label] = {
            "count": total,
            "over_0.1s": total - buckets.get("0.1", total),
            "over_0.25s": total - buckets.get("0.25", total),
        }
    return out


async def bench_concurrency(
    nats_url: str,
    fresh_database: Callable[[], Awaitable[str]],
    reset: Callable[[], Awaitable[None]],
    tmp: Path,
    *,
    sessions: int = 50,
    records: int = 50,
    rates: tuple[float, ...] = (100, 200, 300, 400),
    seconds: float = 20.0,
    think_s: float = 1.5,
    agent_seconds: float = 30.0,
) -> dict[str, object]:
    """Open-loop prepare rates and the agent-like mode, per fleet configuration.

    ``fresh_database()`` gives a new empty database URL and ``reset()`` empties the streams: each
    configuration starts from nothing.
    """
    results: dict[str, object] = {
        "sessions": sessions,
        "records_per_thread": records,
        "seconds_per_rate": seconds,
        "clients": _CLIENTS,
        "cpus": os.cpu_count(),
    }
    for name, workers in _CONFIGS.items():
        database_url = await fresh_database()
        await reset()
        await prepare_servers(nats_url, database_url, tmp / "data")
        env = fleet_env(nats_url, database_url, tmp / "data")
        with FleetProcess(workers, env, tmp / f"concurrency-{name}.log") as fleet:
            clients = [await FleetClient.connect(nats_url, name=f"conc-{name}-{i}") for i in range(_CLIENTS)]
            try:
                pool = await seed_sessions(clients, sessions, records)
                # Warm every view into the fleet's caches before anything is timed.
                await asyncio.gather(*(clients[0].prepare(s.request, timeout=30) for s in pool))
                runs = [await _open_loop(clients, pool, rate, seconds, fleet) for rate in rates]
                agent = await _agent_like(clients, pool, think_s, agent_seconds, fleet)
            finally:
                for client in clients:
                    await client.close()
            results[name] = {
                "open_loop": runs,
                "agent_like": agent,
                "rss_mb": round(fleet.rss_mb(), 1),
                # Where a slow step went, from the fleet's own histograms over the whole run.
                "fleet_slow_counts": _slow_counts(fleet),
            }
    return results
