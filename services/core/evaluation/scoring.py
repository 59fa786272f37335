"""Scoring one trace at one budget: ctxfleet's prepared contexts beside the baselines, probe by probe.

Only contexts prepared where the whole history no longer fits the budget are probed (below it
every system sends everything). Every prepare counts for tokens, failures and cache reuse.
"""

from __future__ import annotations

from contracts import EventKind

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue

from services.core.trace import TraceLine

from services.core.evaluation.baselines import BASELINES, baseline_context
from services.core.evaluation.chat import ChatMsg, History, history_of
from services.core.evaluation.cost import (
    Bill,
    Call,
    Price,
    bill_calls,
    bill_summarizer,
    call_of,
    call_times,
    with_pauses,
)
from services.core.evaluation.fair_count import REPLY_PRIMING, ContextCounter
from services.core.evaluation.probes import PROBE_KINDS, Probe, haystack_of, is_present, probes_at

__all__ = [
    "CTXFLEET",
    "FleetContext",
    "FleetFailure",
    "FleetOutcome",
    "MAX_MISSES",
    "NO_PAUSES",
    "Pauses",
    "ProbeTally",
    "SummarizerCall",
    "SYSTEMS",
    "SystemScore",
    "TraceScore",
    "common_prefix",
    "prepare_points",
    "probe_gate",
    "score_trace",
    "summarizer_calls",
]

CTXFLEET = "ctxfleet"
SYSTEMS: tuple[str, ...] = (CTXFLEET, *BASELINES)
MAX_MISSES = 5
_MISS_CHARS = 120


@dataclass(frozen=True, slots=True)
class FleetContext:
    """A context the fleet prepared: its messages and tools, its summary's tokens and its own count."""

    messages: tuple[ChatMsg, ...]
    tools: tuple[ChatMsg, ...] = ()
    summary_tokens: int = 0
    reported_tokens: int = 0
    # How long the prepare waited on the hot path for a compaction to land (0: it did not).
    compaction_wait_ms: int = 0
    # Where its Anthropic request caches, as counts of leading messages.
    breakpoints: tuple[int, ...] = ()
    # The committed summary it shows (``None``: none) and the last record seq that summary covers.
    summary_id: str | None = None
    covered_to: int = 0
    # The tokens each record it shows or omits stands for (seq, tokens): what a summarizer reads of it.
    record_tokens: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class FleetFailure:
    """A prepare the fleet refused (error code and message)."""

    code: str
    message: str


FleetOutcome = FleetContext | FleetFailure


@dataclass(frozen=True, slots=True)
class Pauses:
    """A pause of ``pause_s`` before every ``every``-th call of a trace (0: none)."""

    every: int = 0
    pause_s: float = 0.0


NO_PAUSES = Pauses()


@dataclass(frozen=True, slots=True)
class SummarizerCall:
    """What an LLM summarizer would be sent and answer for one summary the fleet committed."""

    prepare: int
    input_tokens: int
    output_tokens: int


def summarizer_calls(fleet: Sequence[FleetOutcome], prompt_tokens: int) -> list[SummarizerCall]:
    """One call per new summary the prepared contexts show, in the order they first show it.

    Its input is the summarizer's instructions (``prompt_tokens``), the parent summary and every
    record the new summary covers beyond its parent, at the most tokens a context showed (or
    omitted) that record at; its output is the new summary. A summary replaced before any prepare
    showed it is not seen, so this is a lower bound when compactions outnumber the calls.
    """
    record_tokens: dict[int, int] = {}
    calls: list[SummarizerCall] = []
    summary_id: str | None = None
    covered_to = 0
    summary_tokens = 0
    for ordinal, outcome in enumerate(fleet, start=1):
        if not isinstance(outcome, FleetContext):
            continue
        for seq, tokens in outcome.record_tokens:
            record_tokens[seq] = max(tokens, record_tokens.get(seq, 0))
        if outcome.summary_id is None or outcome.summary_id == summary_id:
            continue
        covered = sum(t for seq, t in record_tokens.items() if covered_to < seq <= outcome.covered_to)
        calls.append(
            SummarizerCall(ordinal, prompt_tokens + summary_tokens + covered, outcome.summary_tokens)
        )
        summary_id, covered_to, summary_tokens = (
            outcome.summary_id,
            outcome.covered_to,
            outcome.summary_tokens,
        )
    return calls


@dataclass(slots=True)
class ProbeTally:
    """Probes of one kind: how many were checked and how many were present."""

    passed: int = 0
    total: int = 0

    @property
    def rate(self) -> float | None:
        """The pass rate, ``None`` if no probe of this kind applied."""
        return self.passed / self.total if self.total else None


@dataclass(slots=True)
class SystemScore:
    """One system's figures over some prepares (one trace, or an aggregate)."""

    system: str
    prepares: int = 0
    failed: int = 0
    failed_required_fits: int = 0
    over_budget: int = 0
    scored: int = 0
    tokens: int = 0
    prefix_tokens: int = 0
    later_tokens: int = 0
    probes: dict[str, ProbeTally] = field(
        default_factory=lambda: {k.value: ProbeTally() for k in PROBE_KINDS}
    )
    steps: int = 0
    compactions: int | None = None
    # Of them, compactions asked for while the thread idled with its cache gone cold.
    idle_compactions: int | None = None
    summary_tokens_end: int | None = None
    tasks: int = 0
    compaction_waits: int = 0
    waited_ms: int = 0
    misses: list[dict[str, JsonValue]] = field(default_factory=list)
    # Per priced model profile, what its calls cost with that provider's prompt cache.
    costs: dict[str, Bill] = field(default_factory=dict)

    @property
    def cache_reuse(self) -> float | None:
        """Token-weighted share of each context that repeats the previous context's prefix."""
        return self.prefix_tokens / self.later_tokens if self.later_tokens else None

    def merge(self, other: SystemScore) -> None:
        """Add ``other``'s counts into this one (aggregates over traces)."""
        self.prepares += other.prepares
        self.failed += other.failed
        self.failed_required_fits += other.failed_required_fits
        self.over_budget += other.over_budget
        self.scored += other.scored
        self.tokens += other.tokens
        self.prefix_tokens += other.prefix_tokens
        self.later_tokens += other.later_tokens
        self.steps += other.steps
        self.tasks += other.tasks
        self.compaction_waits += other.compaction_waits
        self.waited_ms += other.waited_ms
        for kind, tally in other.probes.items():
            self.probes[kind].passed += tally.passed
            self.probes[kind].total += tally.total
        if other.compactions is not None:
            self.compactions = (self.compactions or 0) + other.compactions
        if other.idle_compactions is not None:
            self.idle_compactions = (self.idle_compactions or 0) + other.idle_compactions
        if other.summary_tokens_end is not None:
            self.summary_tokens_end = max(self.summary_tokens_end or 0, other.summary_tokens_end)
        self.misses += other.misses[: max(0, MAX_MISSES - len(self.misses))]
        for profile, bill in other.costs.items():
            self.costs.setdefault(profile, Bill()).merge(bill)

    def as_json(self) -> dict[str, JsonValue]:
        """The figures as JSON (rates rounded to 4 places)."""
        return {
            "system": self.system,
            "prepares": self.prepares,
            "failed": self.failed,
            "failed_while_required_fits": self.failed_required_fits,
            "compaction_waits": self.compaction_waits,
            "waited_ms": self.waited_ms,
            "over_budget": self.over_budget,
            "scored_contexts": self.scored,
            "tokens": self.tokens,
            "tokens_per_task": round(self.tokens / self.tasks) if self.tasks else None,
            "cache_reuse": _round(self.cache_reuse),
            "cost": {profile: bill.as_json(self.tasks) for profile, bill in self.costs.items()},
            "probes": {
                k: {"passed": t.passed, "total": t.total, "rate": _round(t.rate)}
                for k, t in self.probes.items()
            },
            "steps": self.steps,
            "compactions": self.compactions,
            "idle_compactions": self.idle_compactions,
            "compactions_per_100_steps": (
                round(100 * self.compactions / self.steps, 2)
                if self.compactions is not None and self.steps
                else None
            ),
            "summary_tokens_end": self.summary_tokens_end,
            "misses": list(self.misses),
        }


@dataclass(slots=True)
class TraceScore:
    """Every system's score on one trace at one budget, and the probed points in detail."""

    trace: str
    budget: int
    steps: int
    systems: dict[str, SystemScore]
    points: list[dict[str, JsonValue]] = field(default_factory=list)

    def as_json(self) -> dict[str, JsonValue]:
        """The score as JSON."""
        return {
            "trace": self.trace,
            "budget": self.budget,
            "steps": self.steps,
            "systems": {name: s.as_json() for name, s in self.systems.items()},
            "points": list(self.points),
        }


def prepare_points(lines: Sequence[TraceLine]) -> list[int]:
    """Where the replayer prepares: before each assistant message that is not its run's first event."""
    started: set[str | None] = set()
    points = []
    for i, line in enumerate(lines):
        if line.kind == EventKind.ASSISTANT_MESSAGE and line.run in started:
            points.append(i)
        started.add(line.run)
    return points


def common_prefix(a: Sequence[ChatMsg], b: Sequence[ChatMsg]) -> int:
    """How many leading messages ``a`` and ``b`` share exactly."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def score_trace(
    name: str,
    lines: Sequence[TraceLine],
    budget: int,
    fleet: Sequence[FleetOutcome],
    counter: ContextCounter,
    *,
    compactions: int | None = None,
    prices: Mapping[str, Price] | None = None,
    pauses: Pauses = NO_PAUSES,
    summarizer_prompt_tokens: int = 0,
) -> TraceScore:
    """Score ``fleet``'s outcomes (one per ``prepare_points(lines)``) and the baselines at ``budget``;
    price every system's calls with each of ``prices`` (model profile → price), the calls spaced by
    the trace's time and ``pauses``, and ctxfleet's with its summarizer's calls
    (``summarizer_calls``, instructions of ``summarizer_prompt_tokens``)."""
    points = prepare_points(lines)
    if len(fleet) != len(points):
        raise ValueError(f"{name}: {len(fleet)} fleet outcomes for {len(points)} prepares")
    times = with_pauses(call_times(lines, points), pauses.every, pauses.pause_s)
    calls: dict[str, list[Call]] = {s: [] for s in SYSTEMS}
    scores = {s: SystemScore(s, steps=len(points), tasks=1) for s in SYSTEMS}
    scores[CTXFLEET].compactions = compactions
    previous: dict[str, tuple[tuple[ChatMsg, ...], tuple[ChatMsg, ...]]] = {}
    detail: list[dict[str, JsonValue]] = []
    for ordinal, (index, outcome) in enumerate(zip(points, fleet, strict=True), start=1):
        seen = lines[:index]
        history = history_of(seen)
        full_tokens = counter.context(history.messages())
        probed, required_fits = probe_gate(history, budget, counter, full_tokens)
        probes = probes_at(seen) if probed else []
        row: dict[str, JsonValue] = {
            "prepare": ordinal,
            "line": lines[index].line,
            "full_tokens": full_tokens,
        }
        contexts: dict[str, tuple[tuple[ChatMsg, ...], tuple[ChatMsg, ...], int, bool] | None] = {}
        breakpoints: dict[str, tuple[int, ...]] = {}
        if isinstance(outcome, FleetContext):
            breakpoints[CTXFLEET] = outcome.breakpoints
            tokens = counter.context(outcome.messages, outcome.tools)
            contexts[CTXFLEET] = (outcome.messages, outcome.tools, tokens, tokens > budget)
            scores[CTXFLEET].summary_tokens_end = outcome.summary_tokens
            scores[CTXFLEET].compaction_waits += int(outcome.compaction_wait_ms > 0)
            scores[CTXFLEET].waited_ms += outcome.compaction_wait_ms
        else:
            contexts[CTXFLEET] = None
            row["ctxfleet_error"] = f"{outcome.code}: {outcome.message}"
        for kind in BASELINES:
            b = baseline_context(kind, history, budget, counter)
            contexts[kind.value] = (b.messages, (), b.tokens, b.failed)
            # What a careful runtime marks: the end of the system text and the end of the messages.
            breakpoints[kind.value] = (len(history.system), len(b.messages))
        reply = counter.messages(history_of(lines[index : index + 1]).messages())
        for system, ctx in contexts.items():
            score = scores[system]
            score.prepares += 1
            failed = ctx is None or (system != CTXFLEET and ctx[3])
            if failed:
                score.failed += 1
                score.failed_required_fits += int(required_fits)
            if ctx is None:
                continue
            messages, tools, tokens, over = ctx
            score.tokens += tokens
            score.over_budget += int(over)
            calls[system].append(
                call_of(
                    messages,
                    tools,
                    counter,
                    at_s=times[ordinal - 1],
                    output_tokens=reply,
                    breakpoints=breakpoints[system],
                )
            )
            if system in previous:
                prev_messages, prev_tools = previous[system]
                shared = common_prefix(prev_messages, messages)
                score.prefix_tokens += counter.messages(messages[:shared]) + (
                    counter.context([], tools) - REPLY_PRIMING if tools == prev_tools else 0
                )
                score.later_tokens += tokens
            previous[system] = (messages, tools)
        if probed:
            row["systems"] = {
                s: _probe(scores[s], probes, contexts[s], (name, ordinal, lines[index].line)) for s in SYSTEMS
            }
            detail.append(row)
    for system, score in scores.items():
        score.costs = {profile: bill_calls(calls[system], p) for profile, p in (prices or {}).items()}
    summarizing = summarizer_calls(fleet, summarizer_prompt_tokens)
    for profile, p in (prices or {}).items():
        for call in summarizing:
            bill_summarizer(scores[CTXFLEET].costs[profile], call.input_tokens, call.output_tokens, p)
    return TraceScore(name, budget, len(points), scores, detail)


def _probe(
    score: SystemScore,
    probes: list[Probe],
    ctx: tuple[tuple[ChatMsg, ...], tuple[ChatMsg, ...], int, bool] | None,
    where: tuple[str, int, int],
) -> dict[str, JsonValue]:
    """Tally the probes of one context; a failed context shows the model nothing."""
    score.scored += 1
    shown = haystack_of(ctx[0]) if ctx is not None and not (score.system != CTXFLEET and ctx[3]) else ""
    missing: list[JsonValue] = []
    for probe in probes:
        tally = score.probes[probe.kind.value]
        tally.total += 1
        if shown and is_present(probe, shown):
            tally.passed += 1
            continue
        missing.append(probe.kind.value)
        # One example per probe kind: a person looking at what the model saw wants variety, not volume.
        if (
            score.system == CTXFLEET
            and len(score.misses) < MAX_MISSES
            and all(m["probe"] != probe.kind.value for m in score.misses)
        ):
            score.misses.append(
                {
                    "trace": where[0],
                    "prepare": where[1],
                    "line": where[2],
                    "probe": probe.kind.value,
                    "text": probe.text[:_MISS_CHARS],
                    "from_line": probe.line,
                }
            )
    return {
        "tokens": ctx[2] if ctx is not None else 0,
        "failed": ctx is None or (score.system != CTXFLEET and ctx[3]),
        "missing": missing,
    }


def probe_gate(
    history: History, budget: int, counter: ContextCounter, full_tokens: int | None = None
) -> tuple[bool, bool]:
    """(whether a context here is probed, whether the required content fits ``budget``).

    Probed where context management matters and is possible: the whole history no longer fits, but
    the required content does (where it does not, every system fails: see ``failed``).
    """
    required_fits = _required_tokens(history, counter) <= budget
    full = counter.context(history.messages()) if full_tokens is None else full_tokens
    return full > budget and required_fits, required_fits


def _required_tokens(history: History, counter: ContextCounter) -> int:
    """System + task + the newest user input: what no context may leave out."""
    latest_user = [m for u in history.units for m in u.messages if m.get("role") == "user"][-1:]
    return counter.context([*history.system, *history.task, *latest_user])


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
