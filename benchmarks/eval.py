"""``python -m benchmarks.run --only eval``: what the model sees at 4k/8k/16k/32k,
ctxfleet vs the three baselines.

Figures (see docs/eval.md for how to read them):
- per budget, over the bundled samples (infra/samples): probe pass rates, tokens per task,
  cache-reuse rate, failed prepares (and how many while the required content fits), compactions
  per 100 steps, for ctxfleet, ``full``, ``window`` and ``masking``; the same again with the
  4.7k-token system prompt at the budgets where it fits (8k, 16k, 32k);
- the longest sample's summary tokens at the end at each budget;
- a deterministic 1,000-step synthetic coding thread at 8k: summary tokens at the end and at
  most, against ``summary_ratio`` × budget, and its compactions per 100 steps.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from pydantic import JsonValue

from contracts import CompactionPolicy, ContextPolicy
from infra import SAMPLES_DIR
from infra.runtime import Servers, start_fleet
from ctxfleet_client.client import FleetClient
from services.edge.evaluating import EvalReport, EvalTrace, evaluate, policy_name, run_through_fleet
from services.core.evaluation import FleetContext, score_trace, with_system_prompt
from services.core.evaluation.fair_count import ContextCounter
from services.core.evaluation.synthetic import synthetic_trace
from services.settings import Settings
from services.core.tokens import counter_for
from services.core.trace import read_trace

__all__ = ["BUDGETS", "LONGEST", "bench_eval"]

BUDGETS = (4000, 8000, 16000, 32000)
PROMPT_BUDGETS = (8000, 16000, 32000)
LONGEST = "mini-swe-agent-deepseek__deepseek_chat_test_1-100__django__django-13964.jsonl"
SYNTHETIC_STEPS = 1000
SYNTHETIC_BUDGET = 8000


async def bench_eval(
    servers: Servers, settings: Settings, *, samples: Path = SAMPLES_DIR
) -> dict[str, JsonValue]:
    """Every figure above, from one fleet on ``servers``."""
    traces, prompt = _load(samples)
    prompted = [EvalTrace(t.name, tuple(with_system_prompt(t.lines, prompt))) for t in traces]
    fleet = await start_fleet(settings, servers)
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            started = time.perf_counter()
            plain = await evaluate(
                client, traces, BUDGETS, session_prefix=f"bench-eval-{uuid.uuid4().hex[:8]}"
            )
            large = await evaluate(
                client, prompted, PROMPT_BUDGETS, session_prefix=f"bench-evalp-{uuid.uuid4().hex[:8]}"
            )
            replay_s = time.perf_counter() - started
            synthetic = await _synthetic(client)
    finally:
        await fleet.stop()
    return {
        "samples": [t.name for t in traces],
        "system_prompt_tokens": counter_for("o200k_base").count(prompt),
        "budgets": _figures(plain),
        "budgets_with_large_system_prompt": _figures(large),
        "longest_trace": {
            "trace": LONGEST,
            "summary_tokens_end_by_budget": {
                str(s.budget): s.systems["ctxfleet"].summary_tokens_end
                for s in plain.traces
                if s.trace == LONGEST
            },
        },
        "synthetic": synthetic,
        "replay_and_scoring_s": round(replay_s, 1),
    }


def _load(samples: Path) -> tuple[list[EvalTrace], str]:
    traces = [EvalTrace(p.name, tuple(read_trace(p))) for p in sorted(samples.glob("*.jsonl"))]
    return traces, (samples / "system-prompt-large.txt").read_text(encoding="utf-8")


def _figures(report: EvalReport) -> dict[str, JsonValue]:
    """Per budget and system, the aggregate figures without the per-context detail."""
    out: dict[str, JsonValue] = {}
    for budget, systems in report.aggregate().items():
        row: dict[str, JsonValue] = {}
        for name, score in systems.items():
            figures = score.as_json()
            figures.pop("misses")
            assert isinstance(figures["probes"], dict)
            figures["probes"] = {k: v["rate"] for k, v in figures["probes"].items() if isinstance(v, dict)}
            row[name] = figures
        out[str(budget)] = row
    return out


async def _synthetic(client: FleetClient) -> dict[str, JsonValue]:
    lines = synthetic_trace(SYNTHETIC_STEPS)
    ratio = CompactionPolicy().summary_ratio
    await client.register_policy(
        ContextPolicy(name=policy_name(SYNTHETIC_BUDGET), model_profile=None, budget_tokens=SYNTHETIC_BUDGET)
    )
    run = await run_through_fleet(
        client, lines, session_id=f"bench-synth-{uuid.uuid4().hex[:8]}", budget=SYNTHETIC_BUDGET
    )
    summaries = [o.summary_tokens for o in run.outcomes if isinstance(o, FleetContext)]
    score = (
        score_trace(
            "synthetic",
            lines,
            SYNTHETIC_BUDGET,
            run.outcomes,
            ContextCounter(counter_for("o200k_base")),
            compactions=run.compactions,
        )
        .systems["ctxfleet"]
        .as_json()
    )
    return {
        "steps": SYNTHETIC_STEPS,
        "budget": SYNTHETIC_BUDGET,
        "summary_ratio": ratio,
        "summary_share_tokens": int(ratio * SYNTHETIC_BUDGET),
        "summary_tokens_end": summaries[-1] if summaries else None,
        "summary_tokens_max": max(summaries, default=0),
        "within_share": max(summaries, default=0) <= ratio * SYNTHETIC_BUDGET,
        "failed_prepares": score["failed"],
        "compactions_per_100_steps": score["compactions_per_100_steps"],
        "probes": score["probes"],
        "tokens_per_task": score["tokens_per_task"],
        "cache_reuse": score["cache_reuse"],
    }
