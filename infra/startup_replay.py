"""``ctxfleet up``'s startup replay: a sample under a budget it overruns, and where to look at the result.

The bundled sample replays under a policy whose input budget is well below the sample's whole history,
so the fleet compacts during the replay, as it would for a real agent. The replay then waits (bounded)
until a compaction has committed, and :func:`closing_lines` name what a person opens next: the thread,
a ``ctxfleet context`` line to paste, the thread's console page and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from contracts import ContextPolicy
from contracts.subjects import DEFAULT_TENANT
from services.core.trace import TraceLine
from ctxfleet_client.client import FleetClient
from services.edge.replay import ReplayOptions, ReplayReport, replay_trace, trace_events

from . import SAMPLES_DIR

__all__ = [
    "COMPACTION_WAIT_S",
    "SAMPLE",
    "SAMPLE_BUDGET",
    "StartupReplay",
    "closing_lines",
    "context_command",
    "replay_under_budget",
    "replay_until_compacted",
]

# A coding agent's run whose history grows to about 16,000 tokens (o200k) over 98 events: under
# SAMPLE_BUDGET it compacts at least once, and replays in a few seconds.
SAMPLE = SAMPLES_DIR / "mini-swe-agent-deepseek__deepseek_chat_dev__sqlfluff__sqlfluff-2419.jsonl"
SAMPLE_BUDGET = 8000
# How long a replay whose history overran its budget waits for the compactor's first commit: the
# compactor works beside the replay, and a loaded machine may leave it a job behind at the end.
COMPACTION_WAIT_S = 30.0
_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class StartupReplay:
    """What a startup replay did, in the figures its closing lines show."""

    trace: str
    thread_id: str
    budget: int
    events: int
    prepares: int
    failed: int
    latency_ms_p50: float
    compactions: int
    history_tokens: int  # the whole history (``ContextShown.history_tokens``) after the replay
    context_tokens: int | None  # that context (None: no prepare succeeded)


async def replay_under_budget(
    client: FleetClient,
    lines: Sequence[TraceLine],
    options: ReplayOptions,
    budget: int,
    *,
    on_event: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    """Replay ``lines`` in a session pinned to a policy whose input budget is ``budget``."""
    policy = ContextPolicy(name=f"budget-{budget}", model_profile=None, budget_tokens=budget)
    await client.register_policy(policy)
    return await replay_trace(
        client, lines, dataclasses.replace(options, policy=policy.name), on_event=on_event
    )


async def replay_until_compacted(
    client: FleetClient,
    trace: Path,
    lines: Sequence[TraceLine],
    options: ReplayOptions,
    budget: int,
    *,
    wait_s: float = COMPACTION_WAIT_S,
) -> StartupReplay:
    """Replay under ``budget``; if the history overran it, wait up to ``wait_s`` for a compaction."""
    options = dataclasses.replace(options, budget_tokens=budget)
    report = await replay_under_budget(client, lines, options, budget)
    threads = list(dict.fromkeys(e.thread_id for e in trace_events(lines, options)))
    served = [p for p in report.prepares if "error" not in p]
    # The whole history as ``ctxfleet context``, the console and ``ctxfleet compact`` count it.
    history = (await client.show_context(threads[-1])).history_tokens if threads else 0
    compactions = await _compactions(client, threads)
    deadline = time.monotonic() + wait_s
    while compactions == 0 and history > budget and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_S)
        compactions = await _compactions(client, threads)
    return StartupReplay(
        trace=trace.name,
        thread_id=threads[-1] if threads else "",
        budget=budget,
        events=len(lines),
        prepares=len(report.prepares),
        failed=len(report.prepares) - len(served),
        latency_ms_p50=_number(report.totals["latency_ms_p50"]),
        compactions=compactions,
        history_tokens=int(history),
        context_tokens=int(_number(served[-1]["prepared_tokens"])) if served else None,
    )


def _number(value: JsonValue) -> float:
    assert isinstance(value, int | float)
    return value


async def _compactions(client: FleetClient, threads: Sequence[str]) -> int:
    return sum([(await client.inspect(t, limit=1)).summaries for t in threads])


def context_command(thread_id: str, budget: int, *, tenant: str, data_dir: Path | None) -> str:
    """The ``ctxfleet context`` line that shows ``thread_id`` as the runtime got it, from this checkout.

    ``data_dir``: the fleet's data folder when it is not the default one, so a second terminal finds it.
    """
    words = [".venv/bin/ctxfleet"]
    if tenant != DEFAULT_TENANT:
        words += ["--tenant", tenant]
    words += ["context", thread_id, "--budget", str(budget)]
    line = shlex.join(words)
    return line if data_dir is None else f"CTX_DATA_DIR={shlex.quote(str(data_dir))} {line}"


def closing_lines(replay: StartupReplay, *, context: str, console: str, metrics: str) -> list[str]:
    """What the replay did in two lines, then the thread and where to look at it."""
    failed = f", {replay.failed} failed" if replay.failed else ""
    late = (
        f" (none committed within {COMPACTION_WAIT_S:.0f} s)"
        if replay.compactions == 0 and replay.history_tokens > replay.budget
        else ""
    )
    shrunk = (
        ""
        if replay.context_tokens is None
        else f": context {replay.history_tokens:,} → {replay.context_tokens:,} tokens "
        "(whole history → last prepare)"
    )
    return [
        f"replayed {replay.trace} at a budget of {replay.budget:,} tokens:",
        f"  {replay.events} events, {replay.prepares} prepares (p50 {replay.latency_ms_p50:.0f} ms{failed}), "
        f"{replay.compactions} compaction{'' if replay.compactions == 1 else 's'}{late}{shrunk}",
        f"  thread   {replay.thread_id}",
        f"  context  {context}",
        f"  console  {console}",
        f"  metrics  {metrics}",
    ]
