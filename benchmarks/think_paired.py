"""Read-your-writes steps of this checkout and another one, interleaved step by step (issue 16).

On a shared 2-core machine the speed of everything drifts by half or more within minutes (the
publish ack alone, which no fleet code touches, went from 0.9 to 2.2 ms between two runs), so two
``think`` runs minutes apart cannot tell a 10 % change. Here two fleet processes — all five workers
each, as ``make run`` runs them — one from this checkout and one from ``--against DIR`` (another
checkout of ctxfleet, e.g. a ``git worktree`` of the commit to compare with), each on its own NATS
server and database of the same PostgreSQL, take turns: a step on one, then a step on the other, in
alternating order. Both see the same machine at the same moment; each also sees the other's
background work, symmetrically. A step is the ``think`` benchmark's: publish one event, then the
prepare naming it, on a 50–59-record thread.

``make bench BENCH_ARGS="--only think_paired --against /path/to/other/checkout"``
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from infra.embedded import EmbeddedNats
from services.edge.client import FleetClient
from services.edge.replay import percentile

from .fleet_process import ALL_WORKERS, ROOT, FleetProcess, fleet_env
from .think import ROTATE_STEPS, _build_thread, _step

__all__ = ["PAIRED_PAUSES", "bench_think_paired"]

# (pause between steps in s, steps per checkout): back to back, then an agent's think time.
PAIRED_PAUSES: tuple[tuple[float, int], ...] = ((0.0, 200), (1.5, 40))


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


def _figures(values: list[float]) -> dict[str, float]:
    return {f"p{q}_ms": round(percentile(values, q), 2) for q in (50, 90, 99)} | {
        "max_ms": round(max(values), 2)
    }


async def bench_think_paired(
    pg_url: str, tmp: Path, against: Path, *, pauses: tuple[tuple[float, int], ...] = PAIRED_PAUSES
) -> dict[str, object]:
    """Step latencies of this checkout and of ``against`` (an absolute path), steps interleaved."""
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
    try:
        for side, tree in trees.items():
            servers[side] = EmbeddedNats(tmp / f"nats-{side}", sync_always=True)
            nats_url = servers[side].start()
            database_url = _database(pg_url, names[side])
            await asyncio.to_thread(_prepare_with, tree, nats_url, database_url, tmp / f"data-{side}")
            env = fleet_env(nats_url, database_url, tmp / f"data-{side}", PYTHONPATH=str(tree))
            fleets[side] = FleetProcess(ALL_WORKERS, env, tmp / f"paired-{side}.log").__enter__()
            clients[side] = await FleetClient.connect(nats_url, name=f"paired-{side}")
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
                    ack, prepare = await _step(clients[side], t, request, f"paired-{step}")
                    timed[side].append(ack + prepare)
                step += 1
            this, other = _figures(timed["this"]), _figures(timed["against"])
            out[f"pause_{pause:g}s"] = {
                "steps": count,
                "this": this,
                "against": other,
                "ratio_p50": round(this["p50_ms"] / other["p50_ms"], 3),
                "ratio_p99": round(this["p99_ms"] / other["p99_ms"], 3),
            }
        gc.unfreeze()
        return out
    finally:
        for client in clients.values():
            await client.close()
        for fleet in fleets.values():
            fleet.__exit__(None, None, None)
        for server in servers.values():
            server.stop()
