"""``ctxfleet eval``'s shell: replay traces through a running fleet at each budget, keep every context, score.

Each trace is replayed at each budget in a fresh session under a policy whose input budget is that
budget, preparing before every assistant message as ``services.edge.replay`` does. The scoring itself
(baselines, probes, metrics) is the pure ``services.core.evaluation`` package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue

from contracts import AssistantMessageEvent, BlockKind, ContextPolicy, PreparedContext, PrepareRequest

from ctxfleet_client.client import FleetClient
from contracts.exceptions import CtxError
from services.core.evaluation.cost import Price
from services.core.providers.anthropic_messages import cache_breakpoints
from services.core.render import MESSAGE_OVERHEAD
from services.core.evaluation import (
    SYSTEMS,
    ContextCounter,
    FleetContext,
    FleetFailure,
    FleetOutcome,
    SystemScore,
    TraceScore,
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


@dataclass(slots=True)
class EvalReport:
    """Scores per trace × budget, and the aggregate per budget."""

    budgets: tuple[int, ...]
    traces: list[TraceScore] = field(default_factory=list)
    system_prompt_tokens: int | None = None
    prices: dict[str, Price] = field(default_factory=dict)

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
            "aggregate": {
                str(b): {name: s.as_json() for name, s in systems.items()}
                for b, systems in self.aggregate().items()
            },
            "traces": [t.as_json() for t in self.traces],
        }


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
    return FleetContext(
        tuple(prepared.openai_messages()),
        tools,
        summary,
        prepared.budget_report.used.total,
        prepared.compaction_wait_ms,
        cache_breakpoints(prepared.messages, prepared.blocks),
    )


async def run_through_fleet(
    client: FleetClient, lines: Sequence[TraceLine], *, session_id: str, budget: int, wait_ms: int = 30_000
) -> FleetRun:
    """Replay ``lines`` into a fresh session under ``policy_name(budget)``;
    prepare before each assistant message."""
    options = ReplayOptions(
        session_id=session_id, model_profile=None, budget_tokens=budget, policy=policy_name(budget)
    )
    outcomes: list[FleetOutcome] = []
    last_key: dict[str, str] = {}
    for event in trace_events(lines, options):
        thread = event.thread_id
        if isinstance(event, AssistantMessageEvent) and thread in last_key:
            request = PrepareRequest(
                session_id=event.session_id,
                run_id=event.run_id,
                instance_id=event.instance_id,
                budget_tokens=budget,
                after_event_key=last_key[thread],
                wait_ms=wait_ms,
            )
            try:
                outcomes.append(fleet_context(await client.prepare(request)))
            except CtxError as exc:
                outcomes.append(FleetFailure(exc.code.value, _with_items(exc)))
        await client.append(event)
        last_key[thread] = event.event_key
    compactions = [(await client.inspect(thread_id, limit=1)).summaries for thread_id in sorted(last_key)]
    return FleetRun(tuple(outcomes), sum(compactions))


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
) -> EvalReport:
    """Replay every trace at every budget and score it beside the baselines, priced with ``prices``."""
    counter = ContextCounter(counter_for("o200k_base"))
    report = EvalReport(tuple(budgets), prices=dict(prices or {}))
    for budget in budgets:
        await client.register_policy(
            ContextPolicy(name=policy_name(budget), model_profile=None, budget_tokens=budget)
        )
    for t_index, trace in enumerate(traces):
        for budget in budgets:
            run = await run_through_fleet(
                client, trace.lines, session_id=f"{session_prefix}-t{t_index}-b{budget}", budget=budget
            )
            score = score_trace(
                trace.name,
                trace.lines,
                budget,
                run.outcomes,
                counter,
                compactions=run.compactions,
                prices=report.prices,
            )
            report.traces.append(score)
            if on_done is not None:
                on_done(score)
    return report
