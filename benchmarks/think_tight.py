"""Read-your-writes steps at a tight budget in another provider's shape, with think time.

``think`` steps a gpt-4o thread in openai.chat, whose 128k budget keeps the whole 50-record thread.
Here the same steps — publish one event, then the prepare naming it, alternating one call and
sequential (``think._rotating_mode``) — ask for ``BUDGET`` tokens in ``anthropic.messages`` on threads
whose system prompt alone is about ``SYSTEM_TOKENS`` tokens, so each reply leaves most of the history
out. Per pause: step p50 / p99 / max, and every reply's tokens against its budget (``over_budget``
must stay 0) with the system prompt's share.

``make bench BENCH_ARGS="--only think_tight"``.
"""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from contracts import PrepareRequest, ToolSchema
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread

from .fleet_process import ALL_WORKERS, FleetProcess, fleet_env, prepare_servers
from .think import PURE_SYSTEM_TOKENS, ROTATE_STEPS, _build_thread, _ms, _POLICY_LINE, _rotating_mode, _step

__all__ = ["BUDGET", "PAUSES", "SYSTEM_TOKENS", "bench_think_tight"]

BUDGET = 4_000
SYSTEM_TOKENS = PURE_SYSTEM_TOKENS
PAUSES: tuple[tuple[float, int], ...] = ((0.0, 100), (1.5, 60))


async def _tight_thread(client: FleetClient) -> tuple[Thread, PrepareRequest]:
    t, gpt = await _build_thread(client, _POLICY_LINE * (SYSTEM_TOKENS // 16))
    # The thread's calls are bash calls: an Anthropic body with tool blocks must declare the tool.
    request = gpt.model_copy(
        update={
            "model_profile": None,
            "budget_tokens": BUDGET,
            "format": "anthropic.messages",
            "tools": (ToolSchema(name="bash"),),
        }
    )
    await client.prepare(request)  # warmed in this shape too
    return t, request


async def bench_think_tight(nats_url: str, database_url: str, tmp: Path) -> dict[str, object]:
    """Step latencies and budget use per pause, against a fleet process of all five workers."""
    await prepare_servers(nats_url, database_url, tmp / "data")
    out: dict[str, object] = {"budget_tokens": BUDGET, "format": "anthropic.messages"}
    with FleetProcess(ALL_WORKERS, fleet_env(nats_url, database_url, tmp / "data"), tmp / "tight.log"):
        async with await FleetClient.connect(nats_url, name="think-tight") as client:
            rotations = sum(-(-count // ROTATE_STEPS) for _, count in PAUSES)
            threads = iter([await _tight_thread(client) for _ in range(rotations)])
            gc.collect()
            gc.freeze()
            step = 0
            for pause, count in PAUSES:
                took: list[float] = []
                used: list[int] = []
                system = 0
                for n in range(count):
                    if n % ROTATE_STEPS == 0:
                        t, request = next(threads)
                    await asyncio.sleep(pause)
                    step += 1
                    ms, _, prepared = await _step(client, t, request, f"tight-{step}", _rotating_mode(n))
                    took.append(ms)
                    used.append(prepared.budget_report.used.total)
                    system = prepared.budget_report.used.instructions
                out[f"pause_{pause:g}s"] = {
                    "steps": count,
                    **_ms(took),
                    "reply_tokens_max": max(used),
                    "over_budget": sum(1 for u in used if u > BUDGET),
                    "system_prompt_tokens": system,
                }
            gc.unfreeze()
    return out
