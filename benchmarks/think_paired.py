"""Read-your-writes steps of this checkout and another one, interleaved step by step.

On a shared 2-core machine the speed of everything drifts by half or more within minutes (the
publish ack alone, which no fleet code touches, went from 0.9 to 2.2 ms between two runs), so two
``think`` runs minutes apart cannot tell a 10 % change. Here two fleet processes — all five workers
each, as ``make run`` runs them — one from this checkout and one from ``--against DIR`` (another
checkout of ctxfleet, e.g. a ``git worktree`` of the commit to compare with), each on its own NATS
server and database of the same PostgreSQL, take turns: a step on one, then a step on the other, in
alternating order. Both see the same machine at the same moment; each also sees the other's
background work, symmetrically. A step is the ``think`` benchmark's: publish one event, then the
prepare naming it, on a 50–59-record thread.

``pure``: prepares naming no event, of a warmed 50-record thread, taking turns the same way, beside a
bare NATS request/reply on each side's server (an echo subscriber of this process): ``ratio_to_bare``
is a pure prepare's p50 over the bare round trip's.

``agents``: the same comparison under concurrency — ``AGENTS`` sessions of 50-record threads per
checkout, each stepping as the ``concurrency`` benchmark's agent-like mode does (publish, prepare
naming the event, think ``AGENT_THINK_S``). Steps one at a time cannot show what fifty agents at once
do to each other (a notice per commit, a listener woken per batch); so the checkouts take turns in
blocks of ``AGENT_BLOCK_S``, in the order this, against, against, this, …, ``AGENT_BLOCKS`` blocks
each, and each side's steps of all its blocks are pooled. Seeding leaves each fleet with background
work (budgeter, indexer) for a while; the blocks start once both fleet processes are idle, or the
first block would share the machine with the side seeded last.

``make bench BENCH_ARGS="--only think_paired --against /path/to/other/checkout"``
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import nats
from nats.aio.msg import Msg

from contracts import PrepareRequest

from infra.embedded import EmbeddedNats
from ctxfleet_client.client import FleetClient
from services.edge.replay import percentile

from .concurrency import AgentSteps, Session, agent_figures, agent_steps, seed_sessions
from .fleet_process import ALL_WORKERS, ROOT, FleetProcess, fleet_env
from .think import ROTATE_STEPS, _build_thread, _rotating_mode, _step

__all__ = ["AGENTS", "AGENT_BLOCKS", "AGENT_BLOCK_S", "AGENT_THINK_S", "PAIRED_PAUSES", "bench_think_paired"]

# (pause between steps in s, steps per checkout): back to back, then an agent's think time.
PAIRED_PAUSES: tuple[tuple[float, int], ...] = ((0.0, 200), (1.5, 40), (10.0, 8))
# (pause between prepares in s, prepares per checkout) of the pure prepares.
PURE_PAUSES: tuple[tuple[float, int], ...] = ((0.0, 300), (1.5, 20))
AGENTS = 50
AGENT_THINK_S = 1.5
AGENT_BLOCK_S = 7.5
AGENT_BLOCKS = 8
_AGENT_CLIENTS = 4


def _database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def _prepare_with(tree: Path, nats_url: str, database_url: str, data_dir: Path) -> None:
    """Migrations and streams by ``tree``'s own code, as its migration job would."""
    code = (
        "import asyncio; from pathlib import Path; from benchmarks.fleet_process import prepare_servers; "
        f"asyncio.run(prepare_servers({nats_url!r}, {database_url!r}, Path({str(data_dir)!r})))"
    )
    subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=True
    )


async def _settle(fleets: list[FleetProcess], *, idle_cores: float = 0.05, timeout_s: float = 120.0) -> None:
    """Wait until every fleet process used under ``idle_cores`` over a second."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        meters = [fleet.cpu() for fleet in fleets]
        for meter in meters:
            meter.start()
        await asyncio.sleep(1.0)
        if all(meter.stop() < idle_cores for meter in meters):
            return
    raise RuntimeError(f"the fleets were still busy after {timeout_s:g} s")


async def _agents_paired(
    clients: dict[str, list[FleetClient]], pools: dict[str, list[Session]], *, blocks: int, block_s: float
) -> dict[str, object]:
    runs = {side: AgentSteps() for side in clients}
    busy = {side: 0.0 for side in clients}
    sides = list(clients)
    for block in range(blocks):
        for side in sides if block % 2 == 0 else reversed(sides):
            started = time.perf_counter()
            await agent_steps(clients[side], pools[side], AGENT_THINK_S, block_s, runs[side])
            busy[side] += time.perf_counter() - started
    this, other = (agent_figures(runs[side], busy[side]) for side in sides)
    return {
        "sessions": len(pools[sides[0]]),
        "think_s": AGENT_THINK_S,
        "blocks": blocks,
        "block_s": block_s,
        "this": this,
        "against": other,
        "ratio_p50": round(float(this["p50_ms"]) / float(other["p50_ms"]), 3),  # type: ignore[arg-type]
        "ratio_p99": round(float(this["p99_ms"]) / float(other["p99_ms"]), 3),  # type: ignore[arg-type]
    }


async def _pure_paired(
    clients: dict[str, FleetClient], urls: dict[str, str], requests: dict[str, PrepareRequest]
) -> dict[str, object]:
    """Prepares naming no event and bare request/replies, each side in turn."""
    sides = list(clients)
    bare_ncs = {side: await nats.connect(urls[side]) for side in sides}
    for nc in bare_ncs.values():
        await nc.subscribe("bench.echo", cb=_echo)
    out: dict[str, object] = {}
    try:
        for side in sides:
            await clients[side].prepare(requests[side])  # warmed: the view is in the fleet's cache
        for pause, count in PURE_PAUSES:
            pure: dict[str, list[float]] = {side: [] for side in sides}
            bare: dict[str, list[float]] = {side: [] for side in sides}
            for n in range(count):
                for side in sides if n % 2 == 0 else reversed(sides):
                    await asyncio.sleep(pause)
                    started = time.perf_counter()
                    await bare_ncs[side].request("bench.echo", b"x", timeout=5)
                    bare[side].append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    await clients[side].prepare(requests[side])
                    pure[side].append((time.perf_counter() - started) * 1000)
            this, other = _figures(pure["this"]), _figures(pure["against"])
            out[f"pause_{pause:g}s"] = {
                "prepares": count,
                "this": this | {"bare_p50_ms": round(percentile(bare["this"], 50), 3)},
                "against": other | {"bare_p50_ms": round(percentile(bare["against"], 50), 3)},
                "ratio_p50": round(this["p50_ms"] / other["p50_ms"], 3),
                "ratio_p99": round(this["p99_ms"] / other["p99_ms"], 3),
                "ratio_to_bare": {
                    side: round(percentile(pure[side], 50) / percentile(bare[side], 50), 2) for side in sides
                },
            }
    finally:
        for nc in bare_ncs.values():
            await nc.close()
    return out


async def _echo(msg: Msg) -> None:
    await msg.respond(msg.data)


def _figures(values: list[float]) -> dict[str, float]:
    return {f"p{q}_ms": round(percentile(values, q), 2) for q in (50, 90, 99)} | {
        "max_ms": round(max(values), 2)
    }


async def bench_think_paired(
    pg_url: str,
    tmp: Path,
    against: Path,
    *,
    pauses: tuple[tuple[float, int], ...] = PAIRED_PAUSES,
    agents: int = AGENTS,
    agent_blocks: int = AGENT_BLOCKS,
    agent_block_s: float = AGENT_BLOCK_S,
) -> dict[str, object]:
    """Step latencies of this checkout and of ``against`` (an absolute path), steps interleaved; then
    ``agents`` concurrent agents per checkout, in alternating blocks (none when ``agents`` is 0)."""
    trees = {"this": ROOT, "against": against}
    conn = await asyncpg.connect(pg_url)
    names = {side: f"paired_{side}_{uuid.uuid4().hex[:8]}" for side in trees}
    try:
        for name in names.values():
            await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    servers: dict[str, EmbeddedNats] = {}
    fleets: dict[str, FleetProcess] = {}
    clients: dict[str, FleetClient] = {}
    urls: dict[str, str] = {}
    agent_clients: dict[str, list[FleetClient]] = {}
    try:
        for side, tree in trees.items():
            servers[side] = EmbeddedNats(tmp / f"nats-{side}", sync_always=True)
            nats_url = urls[side] = servers[side].start()
            database_url = _database(pg_url, names[side])
            await asyncio.to_thread(_prepare_with, tree, nats_url, database_url, tmp / f"data-{side}")
            env = fleet_env(nats_url, database_url, tmp / f"data-{side}", PYTHONPATH=str(tree))
            fleets[side] = FleetProcess(ALL_WORKERS, env, tmp / f"paired-{side}.log").__enter__()
            clients[side] = await FleetClient.connect(nats_url, name=f"paired-{side}")
            agent_clients[side] = [
                await FleetClient.connect(nats_url, name=f"paired-{side}-agents-{i}")
                for i in range(_AGENT_CLIENTS)
            ]
        steps = sum(count for _, count in pauses)
        threads = {
            side: [await _build_thread(clients[side]) for _ in range(-(-steps // ROTATE_STEPS))]
            for side in trees
        }
        gc.collect()
        gc.freeze()
        out: dict[str, object] = {"against": str(trees["against"]), "workers": "+".join(ALL_WORKERS)}
        step = 0
        for pause, count in pauses:
            timed: dict[str, list[float]] = {side: [] for side in trees}
            for n in range(count):
                order = list(trees) if n % 2 == 0 else list(reversed(trees))
                for side in order:
                    await asyncio.sleep(pause)
                    t, request = threads[side][step // ROTATE_STEPS]
                    took, _, _ = await _step(clients[side], t, request, f"paired-{step}", _rotating_mode(n))
                    timed[side].append(took)
                step += 1
            this, other = _figures(timed["this"]), _figures(timed["against"])
            out[f"pause_{pause:g}s"] = {
                "steps": count,
                "this": this,
                "against": other,
                "ratio_p50": round(this["p50_ms"] / other["p50_ms"], 3),
                "ratio_p99": round(this["p99_ms"] / other["p99_ms"], 3),
            }
        out["pure"] = await _pure_paired(clients, urls, {side: threads[side][0][1] for side in trees})
        if agents:
            pools = {side: await seed_sessions(agent_clients[side], agents, 50) for side in trees}
            await _settle(list(fleets.values()))
            out["agents"] = await _agents_paired(
                agent_clients, pools, blocks=agent_blocks, block_s=agent_block_s
            )
        gc.unfreeze()
        return out
    finally:
        for client in [*clients.values(), *(c for group in agent_clients.values() for c in group)]:
            await client.close()
        for fleet in fleets.values():
            fleet.__exit__(None, None, None)
        for server in servers.values():
            server.stop()
