"""Window rollover on a real fleet: the prepare that rolls over vs an ordinary one.

A few threads under a ``rollover`` policy grow step by step with a prepare before every model call,
as a runtime does. A step is a test run (a ~650-token output), an edit of one of 40 modules
(``sed -i``: the handoff carries the files modified) or a status change of one of 20 tickets (a
catalog effect: the handoff names the state paths), so the handoff is the size a coding agent's is.
The prepare that finds its window RED closes it in the same request — one assembly to measure, one
transaction with the handoff, one assembly of the new window — so its latency is what the rollover
costs a runtime. The part reports p50/p99 of both kinds of prepare as the client sees them, the server's own
``rollover_ms`` (decide, build and commit the handoff), and the handoff's size in tokens.
"""

from __future__ import annotations

import time
import uuid

from contracts import (
    ContextPolicy,
    PathRule,
    PreparedContext,
    PrepareRequest,
    ToolCatalog,
    ToolEffect,
    ToolSchema,
    ToolSpec,
)
from contracts.windows import WindowPolicy, WindowStrategy
from infra.runtime import Servers, start_fleet
from ctxfleet_client.client import FleetClient
from services.edge.replay import percentile
from services.settings import Settings
from tests.fixtures.builders import Thread

__all__ = ["bench_rollover"]

# An 8k input budget: a window reaches RED (90 %) after some forty steps (its older tool outputs are
# masked from YELLOW on), so 8 threads × 300 steps hold some sixty rollovers.
_BUDGET = 8_000
_OUTPUT = "collected 12 items; test_parser.py::test_case_{n} PASSED; coverage line {n} ok\n" * 24
_RELEASE = "bench-roll@1"
CATALOG = ToolCatalog(
    release=_RELEASE,
    paths=(PathRule(pattern="ticket:{id}.status", kind="business_fact"),),
    tools=(
        ToolSpec(
            name="set_status",
            reads=("ticket:{id}.status",),
            effects=(ToolEffect(path="ticket:{args.ticket}.status", value="{result.status}"),),
        ),
        ToolSpec(name="bash"),
    ),
)


async def _step(client: FleetClient, t: Thread, n: int) -> str:
    call, output = f"c{n}", _OUTPUT.format(n=n)
    args: dict[str, object]
    match n % 3:
        case 0:
            tool, args = "bash", {"cmd": f"pytest -k case_{n}"}
        case 1:
            tool, args = "bash", {"cmd": f"sed -i 's/old_{n}/new_{n}/' src/mod_{n % 40}.py"}
            output = ""
        case _:
            tool, args = "set_status", {"ticket": n % 20}
            output = f'{{"status": "step_{n}"}}'
    await client.append(t.assistant(f"step {n}", calls=((call, tool, args),)))
    key = f"o{n}"
    await client.append(t.outcome(call, output, key=key))
    return key


async def _timed(client: FleetClient, request: PrepareRequest) -> tuple[float, PreparedContext]:
    started = time.perf_counter()
    prepared = await client.prepare(request)
    return (time.perf_counter() - started) * 1000, prepared


async def bench_rollover(
    servers: Servers, settings: Settings, *, threads: int = 8, steps: int = 300
) -> dict[str, object]:
    """Latency of rolling and ordinary prepares, and handoff sizes, over ``threads`` × ``steps``."""
    policy = ContextPolicy(
        name=f"bench-roll-{uuid.uuid4().hex[:6]}",
        model_profile=None,
        budget_tokens=_BUDGET,
        window=WindowPolicy(strategy=WindowStrategy.ROLLOVER),
    )
    ordinary: list[float] = []
    rolling: list[float] = []
    server_ms: list[float] = []
    handoff_tokens: list[float] = []
    fleet = await start_fleet(settings, servers)
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            await client.register_policy(policy)
            await client.register_catalog(CATALOG)
            for _ in range(threads):
                t = Thread(session_id=f"roll-{uuid.uuid4().hex[:10]}")
                await client.append(
                    t.system("You fix failing tests.").model_copy(
                        update={"policy": policy.name, "agent_release": _RELEASE}
                    )
                )
                await client.append(t.user("Make the parser test suite pass; never edit the tests."))
                for n in range(steps):
                    after = await _step(client, t, n)
                    request = PrepareRequest(
                        session_id=t.session_id,
                        run_id=t.run_id,
                        instance_id="main",
                        budget_tokens=_BUDGET,
                        after_event_key=after,
                        tools=(ToolSchema(name="bash"), ToolSchema(name="set_status")),
                    )
                    ms, prepared = await _timed(client, request)
                    if prepared.rollover is None:
                        ordinary.append(ms)
                        continue
                    rolling.append(ms)
                    server_ms.append(float(prepared.rollover.rollover_ms))
                    handoff_tokens.append(float(prepared.rollover.handoff_tokens))
    finally:
        await fleet.stop()
    return {
        "budget": _BUDGET,
        "threads": threads,
        "steps_per_thread": steps,
        "ordinary": _quantiles(ordinary),
        "rolling_over": _quantiles(rolling),
        "rollover_ms_server": _quantiles(server_ms),
        "handoff_tokens": {
            **_quantiles(handoff_tokens, digits=0),
            "max": max(handoff_tokens, default=0.0),
        },
    }


def _quantiles(values: list[float], *, digits: int = 2) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), digits) if values else 0.0,
        "p99": round(percentile(values, 99), digits) if values else 0.0,
    }
