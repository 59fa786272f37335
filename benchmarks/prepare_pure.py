"""Pure prepares: no read-your-writes wait, so the figure is what assembling a view costs.

Threads built from the bundled sample traces (their assistant calls and tool outputs, cycled with
fresh call ids): 50 and 500 records under the default gpt-4o profile; a 5,000-record thread that the
fleet's budgeter and compactor compacted as it grew (a 60,000-token policy); the same 5,000 records
with their whole history in view (a 10M-token budget, no summary; recorded with recorder + assembler
only). Once compactions settled and every view fits without waiting, each case is prepared back to
back, in-process through ``PrepareService`` with a real ``PgStore`` (as the assembler worker does)
and through a NATS round trip to the fleet's assembler; p50/p99 per case. The fleet runs in its own
process (``ctxfleet worker``, as ``make run`` runs it), the client in this one: a runtime never
shares the fleet's event loop and core. Every
collection of the garbage collector during the measured loops is timed (``gc.callbacks``, this
process: the in-process loop runs the assembler's code here); the longest is reported.

``make bench BENCH_ARGS="--only pure"``
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from contracts import ContextPolicy, PrepareRequest
from contracts.subjects import prepare_subject
from infra import SAMPLES_DIR
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.views import ViewLoader
from services.core.trace import read_trace
from ctxfleet_client.client import FleetClient
from services.edge.replay import percentile
from services.store.connect import create_pool
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread

from .fleet_process import ALL_WORKERS, FleetProcess, fleet_env, prepare_servers

__all__ = ["bench_pure"]

_COMPACTED_POLICY_TOKENS = 60_000
_WHOLE_HISTORY_TOKENS = 10_000_000


@dataclass(frozen=True, slots=True)
class _Step:
    text: str
    name: str
    args: dict[str, Any]
    output: str
    status: str


def _sample_steps() -> list[_Step]:
    """Every call of the bundled traces with its outcome, in trace order."""
    steps: list[_Step] = []
    for path in sorted(SAMPLES_DIR.glob("*.jsonl")):
        lines = read_trace(path)
        outcomes = {ln.call_id: ln for ln in lines if ln.kind == "tool_outcome"}
        for ln in lines:
            if ln.kind != "assistant_message" or not ln.tool_calls:
                continue
            call = ln.tool_calls[0]
            out = outcomes.get(call.call_id)
            if out is not None:
                steps.append(_Step(ln.text, call.name, dict(call.args), out.text, out.status))
    return steps


def _cycle(steps: list[_Step]) -> Iterator[_Step]:
    while True:
        yield from steps


async def _build(
    client: FleetClient, records: int, steps: list[_Step], *, policy: str | None = None, whole: bool = False
) -> Thread:
    """A thread of ``records`` records: instructions, a task, then call + outcome pairs; all recorded."""
    t = Thread(session_id=f"pure-{uuid.uuid4().hex[:10]}")
    system = t.system("You are a coding agent. Fix the failing tests of the repository.")
    await client.append(system.model_copy(update={"policy": policy}) if policy else system)
    await client.append(t.user("The test suite fails; find out why and fix it."))
    source = _cycle(steps)
    for n in range((records - 2) // 2):
        s = next(source)
        await client.append(t.assistant(s.text, calls=((f"c{n}", s.name, s.args),)))
        await client.append(t.outcome(f"c{n}", s.output, status=s.status, key=f"last-{n}"))
    # Read-your-writes once, so every measured prepare sees the whole thread without waiting.
    await client.prepare(_request(t, after=f"last-{(records - 2) // 2 - 1}", whole=whole))
    return t


def _request(t: Thread, *, after: str | None = None, whole: bool = False) -> PrepareRequest:
    if whole:
        return PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            budget_tokens=_WHOLE_HISTORY_TOKENS,
            after_event_key=after,
            wait_ms=60_000,
        )
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        model_profile="gpt-4o",
        after_event_key=after,
        wait_ms=60_000,
    )


async def _settled(conn: asyncpg.Connection, *, timeout: float = 300.0) -> None:
    """Wait until no compaction is pending or running anywhere (for two seconds), so the measured loops
    share the machine with no background work of the fleet."""
    deadline = time.monotonic() + timeout
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        pending = await conn.fetchval(
            "SELECT count(*) FROM ctx.thread_views WHERE pending_fingerprint IS NOT NULL"
        )
        if pending == 0:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > 2.0:
                return
        else:
            quiet_since = None
        await asyncio.sleep(0.1)
    raise RuntimeError("compactions never settled")


class _GcPauses:
    """Durations of the collector's runs while recording (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0
        self.recording = False

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self.recording:
            self.pauses.append((info["generation"], (time.perf_counter() - self._started) * 1000))


async def _timed(prepare: Callable[[], Awaitable[object]], n: int, gcs: _GcPauses) -> dict[str, object]:
    for _ in range(3):  # first prepares fill the caches: the steady state is what is measured
        await prepare()
    latencies: list[float] = []
    gcs.pauses.clear()
    gcs.recording = True
    try:
        for _ in range(n):
            started = time.perf_counter()
            await prepare()
            latencies.append((time.perf_counter() - started) * 1000)
    finally:
        gcs.recording = False
    return {
        "prepares": n,
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "gc_collections": len(gcs.pauses),
        "gc_max_pause_ms": round(max((ms for _, ms in gcs.pauses), default=0.0), 2),
        "gc_full_collections": sum(1 for g, _ in gcs.pauses if g == 2),
    }


async def _fits(client: FleetClient, conn: asyncpg.Connection, threads: list[Thread]) -> None:
    """Settle until each thread's prepare fits without waiting for a compaction or dropping history:
    what is measured is a pure prepare, not the compactor catching up."""
    for _ in range(10):
        await _settled(conn)
        replies = [await client.prepare(_request(t), timeout=60) for t in threads]
        if all(
            r.compaction_wait_ms == 0 and r.budget_report.reductions.dropped_history == 0 for r in replies
        ):
            return
    raise RuntimeError("the views never fitted their budget without waiting")


async def bench_pure(nats_url: str, database_url: str, tmp: Path) -> dict[str, object]:
    steps = _sample_steps()
    await prepare_servers(nats_url, database_url, tmp / "data")
    env = fleet_env(nats_url, database_url, tmp / "data")
    # The whole-history thread is recorded by recorder + assembler only: a budgeter would re-measure
    # all of it on every recorded batch (5,000 records × the view).
    with FleetProcess(("recorder", "assembler"), env, tmp / "pure-whole.log"):
        async with await FleetClient.connect(nats_url) as client:
            whole = await _build(client, 5_000, steps, whole=True)
    # Then all five workers, as `make run` has them: the budgeter and compactor compact the other
    # threads as they grow; once settled, nothing runs in the background of the measured loops.
    pool = await create_pool(database_url, min_size=2, max_size=4)
    gcs = _GcPauses()
    gc.callbacks.append(gcs)
    out: dict[str, object] = {"fleet": "+".join(ALL_WORKERS) + " in a process of its own"}
    try:
        with FleetProcess(ALL_WORKERS, env, tmp / "pure.log"):
            async with await FleetClient.connect(nats_url) as client:
                await client.register_policy(
                    ContextPolicy(
                        name="pure-compacted", model_profile=None, budget_tokens=_COMPACTED_POLICY_TOKENS
                    )
                )
                compacted = await _build(client, 5_000, steps, policy="pure-compacted")
                small = await _build(client, 50, steps)
                medium = await _build(client, 500, steps)
                conn = await asyncpg.connect(database_url)
                try:
                    await _fits(client, conn, [small, medium, compacted])
                finally:
                    await conn.close()
                out.update(await _measure(client, pool, gcs, small, medium, compacted, whole))
    finally:
        gc.callbacks.remove(gcs)
        await pool.close()
    return out


async def _measure(
    client: FleetClient, pool: asyncpg.Pool, gcs: _GcPauses, *threads: Thread
) -> dict[str, object]:
    """Each case back to back: in-process through ``PrepareService``, the round trip with the client's
    parse, and the round trip up to the reply's bytes."""
    small, medium, compacted, whole = threads
    out: dict[str, object] = {}
    service = PrepareService(PgStore(pool), NoticeBoard(), loader=ViewLoader())
    cases = (
        ("records_50", small, False, 300),
        ("records_500", medium, False, 200),
        ("compacted_5000", compacted, False, 200),
        ("whole_history_5000", whole, True, 20),
    )
    for name, t, big, n in cases:
        request = _request(t, whole=big)
        reply = await service.prepare(request)
        in_process = await _timed(lambda r=request: service.prepare(r), n, gcs)
        round_trip = await _timed(lambda r=request: client.prepare(r, timeout=60), n, gcs)
        # The same round trip up to the reply's bytes: what the fleet costs a client in any
        # language, before the Python client's own parse of the reply into PreparedContext.
        subject = prepare_subject(client.tenant, f"{request.run_id}.{request.instance_id}")
        body = request.model_dump_json().encode()
        received = await _timed(
            lambda s=subject, b=body: client._request(s, b, 60),  # noqa: SLF001
            n,
            gcs,
        )
        out[name] = {
            "messages": len(reply.messages),
            "view_revision": reply.view_revision,
            "compaction_wait_ms": reply.compaction_wait_ms,
            "reply_bytes": len(reply.model_dump_json()),
            "in_process": in_process,
            "nats_round_trip": round_trip,
            "nats_reply_bytes_only": received,
        }
    return out
