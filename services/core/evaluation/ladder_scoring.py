"""Scoring the ladder: each rung's contexts at every prepare of a trace, with the eval's probes. Pure.

Per rung: input tokens per step and per task (the eval's own count, ``counting``), the probes of
``probes`` on the contexts ``scoring`` probes (the whole history no longer fits, the required
content does), the state probe and stale-state survival of ``pollution`` on every context of a
trace with state, windows and prepares per window, and how often a new window showed the state the
old one ended with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue

from contracts import ToolCatalog

from services.core.trace import TraceLine

from services.core.evaluation.chat import history_of
from services.core.evaluation.fair_count import ContextCounter
from services.core.evaluation.ladder import LadderContext
from services.core.evaluation.pollution import current_shown, stale_survives, state_probes_at, text_of
from services.core.evaluation.probes import haystack_of, is_present, probes_at
from services.core.evaluation.scoring import ProbeTally, SystemScore, probe_gate

__all__ = ["LadderTraceScore", "RungScore", "score_point"]


@dataclass(slots=True)
class RungScore:
    """One rung's figures over some prepares (one trace at one budget, or an aggregate)."""

    rung: str
    base: SystemScore
    state: ProbeTally = field(default_factory=ProbeTally)
    # Contexts checked for a superseded value, and those that let one survive.
    stale_checked: int = 0
    stale_survived: int = 0
    windows: int = 0
    recoveries: ProbeTally = field(default_factory=ProbeTally)
    # Contexts that showed evidence blocks (rung G's retrieved archive), and how many blocks in all.
    evidence_contexts: int = 0
    evidence_blocks: int = 0

    @classmethod
    def empty(cls, rung: str) -> RungScore:
        """A score with nothing counted yet."""
        return cls(rung, SystemScore(rung))

    def merge(self, other: RungScore) -> None:
        """Add ``other``'s counts into this one."""
        self.base.merge(other.base)
        self.state.passed += other.state.passed
        self.state.total += other.state.total
        self.stale_checked += other.stale_checked
        self.stale_survived += other.stale_survived
        self.windows += other.windows
        self.recoveries.passed += other.recoveries.passed
        self.recoveries.total += other.recoveries.total
        self.evidence_contexts += other.evidence_contexts
        self.evidence_blocks += other.evidence_blocks

    @property
    def stale_rate(self) -> float | None:
        """Share of checked contexts that let a superseded value survive (lower is better)."""
        return self.stale_survived / self.stale_checked if self.stale_checked else None

    def as_json(self) -> dict[str, JsonValue]:
        """The figures as JSON."""
        b = self.base
        return {
            "rung": self.rung,
            "prepares": b.prepares,
            "failed": b.failed,
            "failed_while_required_fits": b.failed_required_fits,
            "tokens": b.tokens,
            "tokens_per_step": round(b.tokens / b.prepares) if b.prepares else None,
            "tokens_per_task": round(b.tokens / b.tasks) if b.tasks else None,
            "scored_contexts": b.scored,
            "probes": {
                k: {"passed": t.passed, "total": t.total, "rate": _round(t.rate)} for k, t in b.probes.items()
            },
            "state_probe": {
                "passed": self.state.passed,
                "total": self.state.total,
                "rate": _round(self.state.rate),
            },
            "stale_state_survival": {
                "survived": self.stale_survived,
                "checked": self.stale_checked,
                "rate": _round(self.stale_rate),
            },
            "windows": self.windows,
            "prepares_per_window": round(b.prepares / self.windows, 2) if self.windows else None,
            "rollover_recovery": {
                "recovered": self.recoveries.passed,
                "rollovers": self.recoveries.total,
                "rate": _round(self.recoveries.rate),
            },
            "evidence": {"contexts": self.evidence_contexts, "blocks": self.evidence_blocks},
        }


@dataclass(slots=True)
class LadderTraceScore:
    """Every rung's score on one trace at one budget."""

    trace: str
    budget: int
    steps: int
    rungs: dict[str, RungScore]
    # Distinct windows per rung, kept while scoring.
    _windows: dict[str, set[int]] = field(default_factory=dict)

    @classmethod
    def start(cls, trace: str, budget: int, steps: int, rungs: Sequence[str]) -> LadderTraceScore:
        """An empty score for ``rungs`` (one task: a trace is one)."""
        scores = {r: RungScore.empty(r) for r in rungs}
        for s in scores.values():
            s.base.tasks, s.base.steps = 1, steps
        return cls(trace, budget, steps, scores)

    def as_json(self) -> dict[str, JsonValue]:
        """The score as JSON."""
        return {
            "trace": self.trace,
            "budget": self.budget,
            "steps": self.steps,
            "rungs": {name: s.as_json() for name, s in self.rungs.items()},
        }


def score_point(
    score: LadderTraceScore,
    seen: Sequence[TraceLine],
    catalog: ToolCatalog | None,
    contexts: dict[str, LadderContext],
    counter: ContextCounter,
) -> None:
    """Count one prepare (after ``seen``) of every rung into ``score``."""
    history = history_of(seen)
    probed, required_fits = probe_gate(history, score.budget, counter)
    probes = probes_at(seen) if probed else []
    states = state_probes_at(seen, catalog)
    for name, ctx in contexts.items():
        rung = score.rungs[name]
        base = rung.base
        base.prepares += 1
        score._windows.setdefault(name, set()).add(ctx.window)
        rung.windows = len(score._windows[name])
        if ctx.recovered is not None:
            rung.recoveries.total += 1
            rung.recoveries.passed += int(ctx.recovered)
        prepared = ctx.prepared
        messages = prepared.openai_messages() if prepared is not None else []
        tools = [t.function.model_dump(mode="json") for t in prepared.tools] if prepared is not None else []
        tokens = counter.context(messages, tools) if prepared is not None else 0
        base.tokens += tokens
        # A context over the real budget is a request the provider refuses: it shows the model nothing.
        failed = prepared is None or tokens > score.budget
        if prepared is None or failed:
            base.failed += 1
            base.failed_required_fits += int(required_fits)
        else:
            shown_evidence = sum(b.block_id.startswith("evidence:") for b in prepared.blocks)
            rung.evidence_contexts += int(shown_evidence > 0)
            rung.evidence_blocks += shown_evidence
        if probed:
            base.scored += 1
            shown = "" if failed else haystack_of(messages)
            for probe in probes:
                tally = base.probes[probe.kind.value]
                tally.total += 1
                tally.passed += int(bool(shown) and is_present(probe, shown))
        if states:
            rung.state.total += len(states)
        if states and not failed:
            text = text_of(messages)
            rung.state.passed += sum(current_shown(p, text) for p in states)
            if any(p.superseded for p in states):
                rung.stale_checked += 1
                rung.stale_survived += int(any(stale_survives(p, text) for p in states))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
