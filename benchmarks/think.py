"""Read-your-writes with an agent's think time between steps.

The fleet runs in its own process with all five workers, as ``make run`` runs it; this process is
the agent runtime. For each pause between steps (0 s, 1.5 s, 10 s — a model call takes seconds),
publish one event and time publish → prepare reply with ``after_event_key`` naming it. A recorder
that left a half-filled pull request open would hold the event until the request expired, so the
figure would grow with the pause; it must not.

The figure is for a 50-record thread, and every step adds a record: a thread serves
``ROTATE_STEPS`` steps (50 to 59 records), then the next one, built and warmed before the timing,
takes over. (One thread serving every step would grow to hundreds of records, and the later pauses
would measure a view several times larger.) ``growing_0s`` is that other figure on purpose: one thread
stepped back to back from 50 to 300 records, the first and last 25 steps of each mode, to show what a
step costs as the view grows.

The agent process freezes its start-up heap once the thread is built (``gc.freeze()``, as an agent
runtime embedding the client may): otherwise a full
collection of this process's own heap (imports, builders) lands inside a step's parse now and then
(34 ms seen), a cost of the runtime's process, not of the fleet.

Steps alternate between the two ways a runtime can take one (``MODES``), so both meet the same
moments of the machine: ``one_call`` — ``FleetClient.append_and_prepare`` sends the publish and the
prepare naming its event together (the assembler waits for the event either way); ``sequential`` —
the prepare is sent once the publish is acked (``publish_ack_sequential`` is that first half). Next
to the broker the two cost the same: the recorder's write outlasts the ack's way back.
Figures per pause, for each mode and for both pooled (``all_steps``: the same publish → reply, twice
the steps for its p99): p50 / p99 / max of the step, and the fleet's CPU over the run.
``stages_mean_ms`` splits the fleet's part further, from its own ``ctx_record_stage_seconds`` and
``ctx_prepare_stage_seconds`` (services/app/step_timing.py): the mean of each stage over the pause's
steps of both modes — the recorder's read, plan and write; the prepare's wait for its event (which
spans the recorder's stages, and in ``one_call`` the publish too), load, assembly and reply. Means,
not percentiles: they say where a pause's time goes, the step figures say how it is spread.

``pure_*``: prepares that name no event (a runtime that does not ask for read-your-writes) at a tight
budget in another provider's shape — ``PURE_BUDGET`` tokens, ``anthropic.messages``, on a 50-record
thread whose system prompt alone is about ``PURE_SYSTEM_TOKENS`` tokens — with the same pauses. Each
reads the thread's head from the ledger (``services/app/freshness.py``). Every reply must fit its
budget.

``far``: the two ways again, from a second client ``FAR_DELAY_MS`` from the broker each way (every
byte delayed by ``benchmarks/far_link.py``, a process of its own), ``FAR_PAUSES``: a runtime in
another zone, where the ack's way back and the prepare's way out outlast the recorder's write.

``make bench BENCH_ARGS="--only think"`` (``--think-repeats N`` runs the pauses N times over).
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Literal, assert_never
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from contracts import PreparedContext, PrepareRequest
from ctxfleet_client.client import FleetClient
from services.edge.replay import percentile
from services.settings import parse_nats_urls
from tests.fixtures.builders import Thread

from .far_link import FarLink
from .fleet_process import ALL_WORKERS, FleetProcess, fleet_env, prepare_servers

__all__ = [
    "GROWING_STEPS",
    "MODES",
    "PAUSES",
    "PURE_BUDGET",
    "PURE_SYSTEM_TOKENS",
    "ROTATE_STEPS",
    "bench_think",
]

# Steps per pause: enough at 0 s for a p99 that is not the maximum; the maximum is reported too.
PAUSES: tuple[tuple[float, int], ...] = ((0.0, 200), (1.5, 100), (10.0, 16))
# The two ways a runtime can take a step, alternated step by step (see ``_step``).
Mode = Literal["one_call", "sequential"]
MODES: tuple[Mode, ...] = ("one_call", "sequential")
# The figure is for a 50-record thread: each step adds a record, so a thread serves this
# many steps (50 to 59 records) before the next, built beforehand, takes over.
ROTATE_STEPS = 10
GROWING_STEPS = 250
# Pure prepares per pause; at 10 s each one outlives the calibration's 5 s age, so a few tell the story.
PURE_PAUSES: tuple[tuple[float, int], ...] = ((0.0, 200), (1.5, 40), (10.0, 8))
PURE_BUDGET = 4_000
PURE_SYSTEM_TOKENS = 1_500
# A runtime in another zone: every byte between it and the broker delayed this much each way.
FAR_DELAY_MS = 5.0
FAR_PAUSES: tuple[tuple[float, int], ...] = ((0.0, 100), (1.5, 40))
_POLICY_LINE = "Refunds over 500 dollars need a supervisor's written approval before they are issued. "


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(percentile(values, 50), 2),
        "p99_ms": round(percentile(values, 99), 2),
        "max_ms": round(max(values), 2),
    }


async def _build_thread(client: FleetClient, system: str = "You fix bugs.") -> tuple[Thread, PrepareRequest]:
    """A 50-record thread (instructions, a question, 24 tool calls with their outputs), its view warmed
    into the fleet's cache by a prepare before anything is timed."""
    t = Thread()
    await client.append(t.system(system))
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


async def _step(
    client: FleetClient, t: Thread, request: PrepareRequest, key: str, mode: Mode
) -> tuple[float, float | None, PreparedContext]:
    """One step: publish a user message, get the prepare naming it; (step ms, publish ack ms, reply).

    ``sequential``: the prepare is sent once the publish is acked, so the step is ack + prepare.
    ``one_call``: ``append_and_prepare`` sends both at once; its ack is not timed apart (None).
    """
    event = t.user(f"and {key}", key=key)
    named = request.model_copy(update={"after_event_key": key})
    started = time.perf_counter()
    match mode:
        case "one_call":
            prepared = (await client.append_and_prepare(event, named)).prepared
            return (time.perf_counter() - started) * 1000, None, prepared
        case "sequential":
            await client.append(event)
            acked = time.perf_counter()
            prepared = await client.prepare(named)
            return (time.perf_counter() - started) * 1000, (acked - started) * 1000, prepared
        case _:
            assert_never(mode)


def _rotating_mode(n: int) -> Mode:
    """The way of a pause's ``n``-th step: alternated, so both meet the same moments of the machine,
    and each takes the first step of every other thread (the one that may read the ledger)."""
    return MODES[(n + n // ROTATE_STEPS) % len(MODES)]


_STAGE_FAMILIES = {"ctx_record_stage_seconds": "record", "ctx_prepare_stage_seconds": "prepare"}


def _stage_totals(fleet: FleetProcess) -> dict[str, tuple[float, float]]:
    """(seconds, observations) so far of each stage the fleet exports, as ``record_read``, …"""
    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(fleet.metrics()):
        prefix = _STAGE_FAMILIES.get(family.name)
        if prefix is None:
            continue
        for sample in family.samples:
            key = f"{prefix}_{sample.labels['stage']}"
            seconds, count = out.get(key, (0.0, 0.0))
            if sample.name.endswith("_sum"):
                out[key] = (sample.value, count)
            elif sample.name.endswith("_count"):
                out[key] = (seconds, sample.value)
    return out


def _stage_means(spent: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean ms per stage from (seconds, observations) spent over a pause's steps."""
    return {key: round(seconds / count * 1000, 2) for key, (seconds, count) in sorted(spent.items()) if count}


async def _pure_prepares(client: FleetClient) -> dict[str, object]:
    """Prepares naming no event at ``PURE_BUDGET`` tokens in ``anthropic.messages``, per pause."""
    system = _POLICY_LINE * (PURE_SYSTEM_TOKENS // 16)
    t, gpt = await _build_thread(client, system)
    request = gpt.model_copy(
        update={"model_profile": None, "budget_tokens": PURE_BUDGET, "format": "anthropic.messages"}
    )
    warm = await client.prepare(request)
    out: dict[str, object] = {
        "budget_tokens": PURE_BUDGET,
        "format": request.format,
        "system_prompt_tokens": warm.budget_report.used.instructions,
        "reply_tokens": warm.budget_report.used.total,
        "reply_messages": len(warm.request["messages"]) if warm.request else 0,  # type: ignore[arg-type]
    }
    for pause, count in PURE_PAUSES:
        times: list[float] = []
        over_budget = 0
        for _ in range(count):
            await asyncio.sleep(pause)
            started = time.perf_counter()
            reply = await client.prepare(request)
            times.append((time.perf_counter() - started) * 1000)
            over_budget += reply.budget_report.used.total > PURE_BUDGET
        out[f"pure_{pause:g}s"] = {
            "prepares": count,
            **_ms(times),
            "over_budget": over_budget,
        }
    return out


async def _far_steps(
    client: FleetClient, nats_url: str, tmp: Path, threads: list[tuple[Thread, PrepareRequest]]
) -> dict[str, object]:
    """The same steps from a runtime ``FAR_DELAY_MS`` away from the broker each way (``far_link``)."""
    out: dict[str, object] = {"delay_ms_each_way": FAR_DELAY_MS}
    host_port = urlsplit(parse_nats_urls(nats_url)[0]).netloc.rpartition("@")[2]
    with FarLink(host_port, FAR_DELAY_MS, tmp) as link:
        async with await FleetClient.connect(f"nats://127.0.0.1:{link.port}", name="think-far") as far:
            fresh = iter(threads)
            step = 0
            for pause, count in FAR_PAUSES:
                steps: dict[Mode, list[float]] = {mode: [] for mode in MODES}
                for n in range(count):
                    if n % ROTATE_STEPS == 0:
                        t, request = next(fresh)
                        # Warmed just before, so neither way's first step reads the ledger.
                        await client.prepare(request)
                    await asyncio.sleep(pause)
                    step += 1
                    mode = _rotating_mode(n)
                    steps[mode].append((await _step(far, t, request, f"far-{step}", mode))[0])
                out[f"pause_{pause:g}s"] = {mode: {"steps": len(v), **_ms(v)} for mode, v in steps.items()}
    return out


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
            far_rotations = sum(-(-count // ROTATE_STEPS) for _, count in FAR_PAUSES)
            threads = [await _build_thread(client) for _ in range(rotations + 1)]
            rest = [await _build_thread(client) for _ in range(far_rotations)]
            gc.collect()
            gc.freeze()
            cpu = fleet.cpu()
            cpu.start()
            step = 0
            # Per pause and mode: whole steps; per pause: the sequential steps' publish acks.
            steps: dict[tuple[float, Mode], list[float]] = {(p, m): [] for p, _ in PAUSES for m in MODES}
            acks: dict[float, list[float]] = {p: [] for p, _ in PAUSES}
            # Per pause: (seconds, observations) of each fleet stage over its steps.
            spent: dict[float, dict[str, tuple[float, float]]] = {p: {} for p, _ in PAUSES}
            fresh = iter(threads[1:])
            for _ in range(repeats):
                for pause, count in PAUSES:
                    before = _stage_totals(fleet)
                    for n in range(count):
                        if n % ROTATE_STEPS == 0:
                            t, request = next(fresh)
                        await asyncio.sleep(pause)
                        step += 1
                        mode = _rotating_mode(n)
                        took, ack, _ = await _step(client, t, request, f"think-{step}", mode)
                        steps[pause, mode].append(took)
                        if ack is not None:
                            acks[pause].append(ack)
                    for key, (seconds, observed) in _stage_totals(fleet).items():
                        was_s, was_n = before.get(key, (0.0, 0.0))
                        had_s, had_n = spent[pause].get(key, (0.0, 0.0))
                        spent[pause][key] = (had_s + seconds - was_s, had_n + observed - was_n)
            out["fleet_cpu_cores"] = cpu.stop()
            for pause, _ in PAUSES:
                # Both ways pooled: the same publish → reply, twice the steps for its p99.
                pooled = [took for mode in MODES for took in steps[pause, mode]]
                figures: dict[str, object] = {"all_steps": {"steps": len(pooled), **_ms(pooled)}}
                for mode in MODES:
                    figures[mode] = {"steps": len(steps[pause, mode]), **_ms(steps[pause, mode])}
                out[f"pause_{pause:g}s"] = figures | {
                    "publish_ack_sequential": _ms(acks[pause]),
                    "stages_mean_ms": _stage_means(spent[pause]),
                }
            # The same steps back to back on one thread that grows with them: what a step costs as
            # the view grows (every prepare follows a new record, so nothing is reused whole).
            t, request = threads[0]
            growing: dict[Mode, list[float]] = {mode: [] for mode in MODES}
            for n in range(GROWING_STEPS):
                mode = MODES[n % len(MODES)]
                growing[mode].append((await _step(client, t, request, f"grow-{n}", mode))[0])
            out["growing_0s"] = {"records": f"50 → {50 + GROWING_STEPS}"} | {
                mode: {"first_25_steps": _ms(times[:25]), "last_25_steps": _ms(times[-25:])}
                for mode, times in growing.items()
            }
            out["pure"] = await _pure_prepares(client)
            out["far"] = await _far_steps(client, nats_url, tmp, rest)
            gc.unfreeze()  # the other benchmarks of this run measure with their own heaps
    return out
