"""``ctxfleet eval``'s shell: replay traces through a running fleet at each budget, keep every context, score.

Each trace is replayed at each budget in a fresh session under a policy whose input budget is that
budget, preparing before every assistant message as ``services.edge.replay`` does. The scoring itself
(baselines, probes, metrics) is the pure ``services.core.evaluation`` package.

The replay runs at once, but its calls have a simulated time (the trace's ``ts``, pauses): where a
thread has idled long enough for its provider cache to go cold (``cache_cold``), the replay has the
fleet compact it before its next prepare, as the budgeter's idle check would during the pause.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue

from contracts import (
    AssistantMessageEvent,
    BlockKind,
    CompactionPolicy,
    CompactRequest,
    ContextPolicy,
    PreparedContext,
    PrepareRequest,
)

from ctxfleet_client.client import FleetClient
from contracts.exceptions import CtxError
from services.core.compaction.policy import PROVIDER_CACHE_TTL_S, ViewMeasure, cache_cold
from services.core.compaction.select import summary_cap
from services.core.evaluation.cost import Price, cached_floor_ratio, call_times, floor_ratio, with_pauses
from services.edge.http_summarizer import SUMMARY_INSTRUCTION, summary_schema
from services.core.providers.anthropic_messages import cache_breakpoints
from services.core.render import MESSAGE_OVERHEAD
from services.core.evaluation import (
    CTXFLEET,
    SYSTEMS,
    ContextCounter,
    FleetContext,
    FleetFailure,
    FleetOutcome,
    NO_PAUSES,
    Pauses,
    SystemScore,
    TraceScore,
    prepare_points,
    score_trace,
)
from services.edge.replay import ReplayOptions, trace_events
from services.core.tokens import counter_for
from services.core.trace import TraceLine

__all__ = [
    "EVAL_TENANT",
    "EvalReport",
    "EvalTrace",
    "FleetRun",
    "evaluate",
    "fleet_context",
    "policy_name",
    "run_through_fleet",
    "summarizer_prompt_tokens",
]


# The tenant ``ctxfleet eval`` speaks for, unless told: its sessions never crowd a person's own.
EVAL_TENANT = "eval"


@dataclass(frozen=True, slots=True)
class EvalTrace:
    """A trace to evaluate, under the name the report shows."""

    name: str
    lines: tuple[TraceLine, ...]


@dataclass(frozen=True, slots=True)
class FleetRun:
    """What the fleet prepared for one replay: one outcome per prepare, and its compactions."""

    outcomes: tuple[FleetOutcome, ...]
    compactions: int
    # Compactions the replay asked for where a thread's cache had gone cold while it idled.
    idle_compactions: int = 0


@dataclass(slots=True)
class EvalReport:
    """Scores per trace × budget, and the aggregate per budget."""

    budgets: tuple[int, ...]
    traces: list[TraceScore] = field(default_factory=list)
    system_prompt_tokens: int | None = None
    prices: dict[str, Price] = field(default_factory=dict)
    pauses: Pauses = NO_PAUSES

    def aggregate(self) -> dict[int, dict[str, SystemScore]]:
        """Per budget, each system's figures summed over the traces."""
        out: dict[int, dict[str, SystemScore]] = {
            b: {s: SystemScore(s) for s in SYSTEMS} for b in self.budgets
        }
        for score in self.traces:
            for name, system in score.systems.items():
                out[score.budget][name].merge(system)
        return out

    def as_json(self) -> dict[str, JsonValue]:
        """Everything ``--json`` writes."""
        return {
            "budgets": list(self.budgets),
            "system_prompt_tokens": self.system_prompt_tokens,
            "counting": (
                "o200k_base, OpenAI chat framing: content, role, tool call id/name/arguments, "
                "tool_call_id, tools"
            ),
            "prices": {name: p.model_dump(mode="json") for name, p in self.prices.items()},
            "pauses": {"every": self.pauses.every, "pause_s": self.pauses.pause_s},
            "floor": {
                str(b): {
                    p: _round(floor_ratio(systems[CTXFLEET].costs[p], systems["masking"].costs[p], price))
                    for p, price in self.prices.items()
                }
                for b, systems in self.aggregate().items()
            },
            "floor_all_cached": {
                str(b): {
                    p: _round(
                        cached_floor_ratio(systems[CTXFLEET].costs[p], systems["masking"].costs[p], price)
                    )
                    for p, price in self.prices.items()
                }
                for b, systems in self.aggregate().items()
            },
            "aggregate": {
                str(b): {name: s.as_json() for name, s in systems.items()}
                for b, systems in self.aggregate().items()
            },
            "traces": [t.as_json() for t in self.traces],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def policy_name(budget: int) -> str:
    """The policy an evaluation at ``budget`` runs under."""
    return f"eval-budget-{budget}"


def fleet_context(prepared: PreparedContext) -> FleetContext:
    """What the model sees of a prepared context, with its summary's tokens."""
    tools = tuple(t.function.model_dump(mode="json") for t in prepared.tools)
    # The summary's own text, as its share bounds it (the block also counts its message framing).
    summary = sum(
        b.tokens - MESSAGE_OVERHEAD * b.message_count for b in prepared.blocks if b.kind == BlockKind.SUMMARY
    )
    records: dict[int, int] = {}
    shown = [(b.kind, b.sources, b.tokens) for b in prepared.blocks]
    for kind, sources, tokens in [*shown, *((b.kind, b.sources, b.tokens) for b in prepared.omitted)]:
        if kind == BlockKind.SUMMARY or not sources:
            continue
        for ref in sources:
            records[ref.seq] = max(records.get(ref.seq, 0), tokens // len(sources))
    return FleetContext(
        tuple(prepared.openai_messages()),
        tools,
        summary,
        prepared.budget_report.used.total,
        prepared.compaction_wait_ms,
        cache_breakpoints(prepared.messages, prepared.blocks),
        summary_id=prepared.summary.summary_id if prepared.summary else None,
        covered_to=prepared.summary.covered_to if prepared.summary else 0,
        record_tokens=tuple(sorted(records.items())),
    )


def summarizer_prompt_tokens() -> int:
    """What an LLM summarizer is sent besides the records and the parent summary: its instruction
    and the schema it answers in (``HttpSummarizer``'s request)."""
    counter = counter_for("o200k_base")
    return counter.count(SUMMARY_INSTRUCTION) + counter.count(json.dumps(summary_schema()))


async def run_through_fleet(
    client: FleetClient,
    lines: Sequence[TraceLine],
    *,
    session_id: str,
    budget: int,
    wait_ms: int = 30_000,
    pauses: Pauses = NO_PAUSES,
    cache_ttl_s: float | None = PROVIDER_CACHE_TTL_S["openai"],
) -> FleetRun:
    """Replay ``lines`` into a fresh session under ``policy_name(budget)``; prepare before each
    assistant message, compacting first a thread idle past ``cache_ttl_s`` (``None``: never)."""
    options = ReplayOptions(
        session_id=session_id, model_profile=None, budget_tokens=budget, policy=policy_name(budget)
    )
    times = with_pauses(call_times(lines, prepare_points(lines)), pauses.every, pauses.pause_s)
    outcomes: list[FleetOutcome] = []
    last_key: dict[str, str] = {}
    served: dict[str, tuple[float, PreparedContext | None]] = {}
    idle_compactions = 0
    for event in trace_events(lines, options):
        thread = event.thread_id
        if isinstance(event, AssistantMessageEvent) and thread in last_key:
            at_s = times[len(outcomes)]
            if cache_ttl_s is not None and thread in served and _gone_cold(served[thread], at_s, cache_ttl_s):
                idle_compactions += await _compact(client, event)
            request = PrepareRequest(
                session_id=event.session_id,
                run_id=event.run_id,
                instance_id=event.instance_id,
                budget_tokens=budget,
                after_event_key=last_key[thread],
                wait_ms=wait_ms,
            )
            prepared: PreparedContext | None = None
            try:
                prepared = await client.prepare(request)
                outcomes.append(fleet_context(prepared))
            except CtxError as exc:
                outcomes.append(FleetFailure(exc.code.value, _with_items(exc)))
            served[thread] = (at_s, prepared)
        await client.append(event)
        last_key[thread] = event.event_key
    compactions = 0
    for thread_id in sorted(last_key):
        compactions += (await client.inspect(thread_id, limit=1)).summaries
    return FleetRun(tuple(outcomes), compactions, idle_compactions)


def _gone_cold(last: tuple[float, PreparedContext | None], at_s: float, ttl_s: float) -> bool:
    """The budgeter's idle rule over what the replay knows of a thread: the time its last context
    was served, and what that context shows of history and summary less the summary that would
    replace them (the budgeter's ``reducible``, counting the recent groups a compaction keeps)."""
    served_at, prepared = last
    if prepared is None:
        return False
    used, budget = prepared.budget_report.used, prepared.budget_report.input_budget
    required = used.total - used.history - used.summaries - used.materials
    successor = summary_cap(CompactionPolicy(), budget, required) + MESSAGE_OVERHEAD
    history = used.history
    measure = ViewMeasure(
        estimated=used.total,
        required=required,
        compressible=history,
        budget=budget,
        reducible=history + used.summaries - successor,
    )
    return cache_cold(measure, at_s - served_at, ttl_s)


async def _compact(client: FleetClient, event: AssistantMessageEvent) -> int:
    """Compact the event's thread now, as the budgeter does a thread gone cold: 1 if it committed."""
    request = CompactRequest(run_id=event.run_id, instance_id=event.instance_id, session_id=event.session_id)
    try:
        await client.compact(request)
    except CtxError:
        return 0  # nothing the policy lets go: the idle check finds nothing to do
    return 1


def _with_items(exc: CtxError) -> str:
    """The error's message and, for a budget refusal, its largest items:
    what a person debugging it looks at first."""
    items = exc.details.get("items")
    if not isinstance(items, list):
        return exc.message
    sized = sorted((i for i in items if isinstance(i, dict)), key=lambda i: -int(str(i.get("tokens", 0))))
    return exc.message + " (" + ", ".join(f"{i.get('block_id')} {i.get('tokens')}" for i in sized[:6]) + ")"


async def evaluate(
    client: FleetClient,
    traces: Sequence[EvalTrace],
    budgets: Sequence[int],
    *,
    session_prefix: str,
    on_done: Callable[[TraceScore], None] | None = None,
    prices: Mapping[str, Price] | None = None,
    pauses: Pauses = NO_PAUSES,
    idle_compaction: bool = True,
) -> EvalReport:
    """Replay every trace at every budget and score it beside the baselines, priced with ``prices``,
    the calls spaced by ``pauses`` too; ``idle_compaction`` has the fleet compact a thread whose
    cache went cold (at the shortest TTL of ``prices``)."""
    counter = ContextCounter(counter_for("o200k_base"))
    report = EvalReport(tuple(budgets), prices=dict(prices or {}), pauses=pauses)
    ttls = [p.cache_ttl_s for p in report.prices.values()] or [PROVIDER_CACHE_TTL_S["openai"]]
    prompt_tokens = summarizer_prompt_tokens()
    for budget in budgets:
        await client.register_policy(
            ContextPolicy(name=policy_name(budget), model_profile=None, budget_tokens=budget)
        )
    for t_index, trace in enumerate(traces):
        for budget in budgets:
            run = await run_through_fleet(
                client,
                trace.lines,
                session_id=f"{session_prefix}-t{t_index}-b{budget}",
                budget=budget,
                pauses=pauses,
                cache_ttl_s=min(ttls) if idle_compaction else None,
            )
            score = score_trace(
                trace.name,
                trace.lines,
                budget,
                run.outcomes,
                counter,
                compactions=run.compactions,
                prices=report.prices,
                pauses=pauses,
                summarizer_prompt_tokens=prompt_tokens,
            )
            score.systems[CTXFLEET].idle_compactions = run.idle_compactions
            report.traces.append(score)
            if on_done is not None:
                on_done(score)
    return report
