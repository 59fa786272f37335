"""Read-your-writes with an agent's think time between steps (issue 16).

The fleet runs in its own process with all five workers, as ``make run`` runs it; this process is
the agent runtime. For each pause between steps (0 s, 1.5 s, 10 s — a model call takes seconds),
publish one event and time publish → prepare reply with ``after_event_key`` naming it. A recorder
that left a half-filled pull request open would hold the event until the request expired, so the
figure would grow with the pause; it must not.

Issue 16's figure is for a 50-record thread, and every step adds a record: a thread serves
``ROTATE_STEPS`` steps (50 to 59 records), then the next one, built and warmed before the timing,
takes over. (Until December 3 one thread served every step and grew to 322 records, so the later
pauses measured a six times larger view.) ``growing_0s`` is that other figure on purpose: one thread
stepped back to back from 50 to 300 records, its first and last 50 steps, to show what a step costs
as the view grows.

The agent process freezes its start-up heap once the thread is built (``gc.freeze()``, as the fleet
does after start-up and as an agent runtime embedding the client should): otherwise a full
collection of this process's own heap (imports, builders) lands inside a step's parse now and then
(34 ms seen), a cost of the runtime's process, not of the fleet.

Each step is also split in its two halves: the publish ack, and the prepare that waits for the event
(recorded, handed over, assembled, sent). Figures per pause: p50 / p99 / max of the step and of each
half, and the fleet's CPU over the run.

``make bench BENCH_ARGS="--only think"`` (``--think-repeats N`` runs the pauses N times over).
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

from contracts import PrepareRequest
from services.edge.client import FleetClient
from services.edge.replay import percentile
from tests.fixtures.builders import Thread

from .fleet_process import ALL_WORKERS, FleetProcess, fleet_env, prepare_servers

__all__ = ["GROWING_STEPS", "PAUSES", "ROTATE_STEPS", "bench_think"]

# Steps per pause: enough at 0 s for a p99 that is not the maximum; the maximum is reported too.
PAUSES: tuple[tuple[float, int], ...] = ((0.0, 200), (1.5, 60), (10.0, 12))
# The figure is for a 50-record thread: each step adds a record, so a thread serves this
# many steps (50 to 59 records) before the next, built beforehand, takes over.
ROTATE_STEPS = 10
GROWING_STEPS = 250


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50), 2),
        "p99_ms": round(percentile(values, 99), 2),
        "max_ms": round(max(values), 2),
    }


async def _build_thread(client: FleetClient) -> tuple[Thread, PrepareRequest]:
    """A 50-record thread (instructions, a question, 24 tool calls with their outputs), its view warmed
    into the fleet's cache by a prepare before anything is timed."""
    t = Thread()
    await client.append(t.system("You fix bugs."))
    await client.append(t.user("Fix the failing test."))
    for n in range(24):
        await client.append(t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat f{n}.py"}),)))
        last = t.outcome(f"c{n}", f"line {n}\n" * 20)
        await client.append(last)
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        model_profile="gpt-4o",
        wait_ms=5_000,
    )
    await client.prepare(request.model_copy(update={"after_event_key": last.event_key}), timeout=30)
    return t, request


async def _step(client: FleetClient, t: Thread, request: PrepareRequest, key: str) -> tuple[float, float]:
    """One step: publish a user message, then the prepare naming it; (ack ms, prepare ms)."""
    started = time.perf_counter()
    await client.append(t.user(f"and {key}", key=key))
    acked = time.perf_counter()
    await client.prepare(request.model_copy(update={"after_event_key": key}))
    done = time.perf_counter()
    return (acked - started) * 1000, (done - acked) * 1000


async def bench_think(nats_url: str, database_url: str, tmp: Path, *, repeats: int = 1) -> dict[str, object]:
    """The step latencies per pause, against a fleet process of all five workers."""
    await prepare_servers(nats_url, database_url, tmp / "data")
    env = fleet_env(nats_url, database_url, tmp / "data")
    out: dict[str, object] = {
        "workers": "+".join(ALL_WORKERS),
        "repeats": repeats,
        "thread_records": f"50-{50 + ROTATE_STEPS - 1} (a fresh 50-record thread every {ROTATE_STEPS} steps)",
    }
    with FleetProcess(ALL_WORKERS, env, tmp / "think.log") as fleet:
        async with await FleetClient.connect(nats_url, name="think") as client:
            rotations = sum(-(-count // ROTATE_STEPS) for _, count in PAUSES) * repeats
            threads = [await _build_thread(client) for _ in range(rotations + 1)]
            gc.collect()
            gc.freeze()
            cpu = fleet.cpu()
            cpu.start()
            step = 0
            # Per pause: whole steps, their publish acks, their prepares.
            steps: dict[float, tuple[list[float], list[float], list[float]]] = {
                p: ([], [], []) for p, _ in PAUSES
            }
            fresh = iter(threads[1:])
            for _ in range(repeats):
                for pause, count in PAUSES:
                    total, acks, prepares = steps[pause]
                    for n in range(count):
                        if n % ROTATE_STEPS == 0:
                            t, request = next(fresh)
                        await asyncio.sleep(pause)
                        step += 1
                        ack, prepare = await _step(client, t, request, f"think-{step}")
                        total.append(ack + prepare)
                        acks.append(ack)
                        prepares.append(prepare)
            out["fleet_cpu_cores"] = cpu.stop()
            for pause, _ in PAUSES:
                total, acks, prepares = steps[pause]
                out[f"pause_{pause:g}s"] = {
                    "steps": len(total),
                    **_ms(total),
                    "publish": _ms(acks),
                    "prepare": _ms(prepares),
                }
            # The same steps back to back on one thread that grows with them: what a step costs as
            # the view grows (every prepare follows a new record, so nothing is reused whole).
            t, request = threads[0]
            growing: list[float] = []
            for n in range(GROWING_STEPS):
                ack, prepare = await _step(client, t, request, f"grow-{n}")
                growing.append(ack + prepare)
            gc.unfreeze()  # the other benchmarks of this run measure with their own heaps
            out["growing_0s"] = {
                "records": f"50 → {50 + GROWING_STEPS}",
                "first_50_steps": _ms(growing[:50]),
                "last_50_steps": _ms(growing[-50:]),
            }
    return out
