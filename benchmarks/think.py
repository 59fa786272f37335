"""Read-your-writes with an agent's think time between steps (issue 16).

A 50-record thread; then, for each pause between steps (0 s, 1.5 s, 10 s — a model call takes
seconds), publish one event and time publish → prepare reply with ``after_event_key`` naming it. A
recorder that left a half-filled pull request open would hold the event until the request expired,
so the figure would grow with the pause; it must not.

``make bench BENCH_ARGS="--only think"``
"""

from __future__ import annotations

import asyncio
import time

from contracts import PrepareRequest
from infra.runtime import Servers, start_fleet
from services.edge.replay import percentile
from services.edge.client import FleetClient
from services.settings import Settings
from tests.fixtures.builders import Thread

__all__ = ["bench_think"]

PAUSES: tuple[tuple[float, int], ...] = ((0.0, 40), (1.5, 20), (10.0, 6))


async def bench_think(servers: Servers, settings: Settings) -> dict[str, object]:
    fleet = await start_fleet(settings, servers)
    out: dict[str, object] = {}
    try:
        async with await FleetClient.connect(servers.nats_url) as client:
            t = Thread()
            await client.append(t.system("You fix bugs."))
            await client.append(t.user("Fix the failing test."))
            for n in range(24):
                await client.append(t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat f{n}.py"}),)))
                await client.append(t.outcome(f"c{n}", f"line {n}\n" * 20))
            step = 0
            for pause, steps in PAUSES:
                latencies: list[float] = []
                for _ in range(steps):
                    await asyncio.sleep(pause)
                    step += 1
                    key = f"think-{step}"
                    started = time.perf_counter()
                    await client.append(t.user(f"and step {step}", key=key))
                    await client.prepare(
                        PrepareRequest(
                            session_id=t.session_id,
                            run_id=t.run_id,
                            instance_id=t.instance_id,
                            model_profile="gpt-4o",
                            after_event_key=key,
                            wait_ms=5_000,
                        )
                    )
                    latencies.append((time.perf_counter() - started) * 1000)
                out[f"pause_{pause:g}s"] = {
                    "steps": steps,
                    "p50_ms": round(percentile(latencies, 50), 2),
                    "p99_ms": round(percentile(latencies, 99), 2),
                    "max_ms": round(max(latencies), 2),
                }
    finally:
        await fleet.stop()
    return out
