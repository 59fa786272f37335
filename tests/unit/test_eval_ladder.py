"""The ablation ladder: each rung differs from the next as it must, at fixed small budgets (no timing)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

import services.core.state as state_module
from services.core.evaluation.inventory import INVENTORY_CATALOG, inventory_trace
from services.core.evaluation.ladder import LadderContext, LadderPoint, Rung, RungName, core_rungs
from services.core.evaluation.probes import haystack_of
from services.core.evaluation.rollover_rung import RolloverRung
from services.core.state import Fact
from infra.laddering import LadderTrace, ladder_trace

pytestmark = pytest.mark.anyio

# 40 moves of 4 items: every item is moved ten times, so each has nine superseded bins.
_MOVES, _ITEMS = 40, 4
# Tight enough that the whole history stops fitting about a third of the way in; roomy enough for the
# required content (system, task, the newest question, the state block of four facts).
_BUDGET = 1_500


@dataclass
class _Watching:
    """A core rung that keeps what it sent at every point (the rung interface, used as a spy)."""

    inner: Rung
    sent: list[LadderContext] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.inner.name

    def context(self, point: LadderPoint) -> LadderContext:
        ctx = self.inner.context(point)
        self.sent.append(ctx)
        return ctx


def _trace() -> LadderTrace:
    return LadderTrace("inventory", tuple(inventory_trace(_MOVES, _ITEMS)), INVENTORY_CATALOG)


async def _run(names: tuple[RungName, ...]) -> tuple[dict[str, _Watching], dict[str, dict]]:  # type: ignore[type-arg]
    spies: dict[str, _Watching] = {}

    def rungs() -> list[Rung]:
        spies.clear()
        spies.update({r.name: _Watching(r) for r in core_rungs(names)})
        return list(spies.values())

    score = await ladder_trace(_trace(), _BUDGET, rungs=rungs)
    return spies, {name: s.as_json() for name, s in score.rungs.items()}


def _tokens(ctx: LadderContext) -> int:
    assert ctx.prepared is not None
    return ctx.prepared.budget_report.used.total


async def test_ladder_full_history_grows_with_every_step_and_fails_past_the_budget() -> None:
    spies, scores = await _run((RungName.FULL,))

    sizes = [_tokens(c) for c in spies[RungName.FULL.value].sent]
    assert all(a < b for a, b in zip(sizes, sizes[1:], strict=False))  # never reduced, never capped
    assert sizes[-1] > 2 * _BUDGET
    over = sum(s > _BUDGET for s in sizes)
    assert over > 0 and scores[RungName.FULL.value]["failed"] == over


async def test_ladder_window_drops_the_oldest_history_and_keeps_the_newest_within_the_budget() -> None:
    spies, scores = await _run((RungName.WINDOW,))
    sent = spies[RungName.WINDOW.value].sent

    assert scores[RungName.WINDOW.value]["failed"] == 0
    assert all(_tokens(c) <= _BUDGET for c in sent)
    last = sent[-1].prepared
    assert last is not None and last.summary is None
    shown = haystack_of(last.openai_messages())
    first_bin, newest_bin = _bins()[0], _bins()[-1]
    assert first_bin not in shown and newest_bin in shown
    assert any(o.reason.startswith("history awaiting compaction") for o in last.omitted)


async def test_ladder_pollution_probe_catches_superseded_values_in_every_rung_without_projection() -> None:
    _, scores = await _run((RungName.WINDOW, RungName.SUMMARY, RungName.STATE, RungName.PROJECTION))

    stale = {name: s["stale_state_survival"] for name, s in scores.items()}
    for rung in (RungName.WINDOW, RungName.SUMMARY, RungName.STATE):
        assert stale[rung.value]["survived"] > 0, rung
    projection = stale[RungName.PROJECTION.value]
    assert projection["checked"] > 0 and projection["survived"] == 0
    assert scores[RungName.PROJECTION.value]["state_probe"]["rate"] == 1.0
    # The materialized state shows the same current values, only without what they superseded.
    assert scores[RungName.STATE.value]["state_probe"]["rate"] == 1.0


async def test_ladder_projection_fails_the_pollution_probe_when_supersession_breaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = state_module._supersede

    def forgetting(*args: object) -> Fact:  # a regression: newer facts no longer name what they replace
        return replace(real(*args), supersedes=None, superseded_value=None)  # type: ignore[arg-type]

    monkeypatch.setattr(state_module, "_supersede", forgetting)
    _, scores = await _run((RungName.PROJECTION,))

    assert scores[RungName.PROJECTION.value]["stale_state_survival"]["survived"] > 0


@dataclass
class _TwoWindows:
    """A rung in windows (as a rollover rung is): the second half of the points is a new window."""

    inner: Rung
    points: int = 0

    @property
    def name(self) -> str:
        return "two-windows"

    def context(self, point: LadderPoint) -> LadderContext:
        self.points += 1
        ctx = self.inner.context(point)
        window = 1 if self.points <= 20 else 2
        return replace(ctx, window=window, recovered=True if self.points == 21 else None)


async def test_ladder_scores_windows_and_recoveries_of_a_rung_that_brings_its_own() -> None:
    score = await ladder_trace(
        _trace(), _BUDGET, rungs=lambda: [_TwoWindows(core_rungs((RungName.PROJECTION,))[0])]
    )

    s = score.rungs["two-windows"].as_json()
    assert s["windows"] == 2 and s["prepares_per_window"] == s["prepares"] / 2
    assert s["rollover_recovery"] == {"recovered": 1, "rollovers": 1, "rate": 1.0}


def _bins() -> list[str]:
    return [
        str(c.args["to"])
        for line in inventory_trace(_MOVES, _ITEMS)
        for c in line.tool_calls
        if c.name == "move_item"
    ]


async def test_ladder_rollover_rung_opens_new_windows_from_state_and_each_shows_the_state_before_it() -> None:
    spies: dict[str, _Watching] = {}

    def rungs() -> list[Rung]:
        spies.clear()
        spies["rollover"] = _Watching(RolloverRung(rules=INVENTORY_CATALOG.paths))
        return list(spies.values())

    score = await ladder_trace(_trace(), _BUDGET, rungs=rungs)

    s = score.rungs["rollover"].as_json()
    assert s["windows"] > 1 and s["failed"] == 0
    assert s["rollover_recovery"]["rollovers"] == s["windows"] - 1
    assert s["rollover_recovery"]["rate"] == 1.0
    assert s["stale_state_survival"]["survived"] == 0
    sent = spies["rollover"].sent
    assert all(_tokens(c) <= _BUDGET for c in sent)
    # A new window shows none of the closed window's history: the first bin is gone, the state stays.
    last = sent[-1].prepared
    assert last is not None and last.window == s["windows"]
    assert _bins()[0] not in haystack_of(last.openai_messages())


async def test_ladder_retrieval_rung_adds_archived_records_of_the_step_and_never_a_superseded_one() -> None:
    spies, scores = await _run((RungName.PROJECTION, RungName.RETRIEVAL))
    sent = spies[RungName.RETRIEVAL.value].sent

    shown = [c.prepared for c in sent if c.prepared is not None]
    with_evidence = [p for p in shown if any(b.block_id.startswith("evidence:") for b in p.blocks)]
    # Once the summary covers history there is an archive to search, and G shows what it found.
    assert with_evidence and all(p.summary is not None for p in with_evidence)
    g, f = scores[RungName.RETRIEVAL.value], scores[RungName.PROJECTION.value]
    assert g["failed"] == 0 and all(_tokens(c) <= _BUDGET for c in sent)
    assert g["tokens_per_step"] > f["tokens_per_step"]
    assert g["evidence"]["contexts"] == len(with_evidence) and f["evidence"]["contexts"] == 0
    # The search marks the moves an item's later moves superseded, so G brings no old bin back.
    assert g["stale_state_survival"]["survived"] == 0
    assert g["state_probe"]["rate"] == 1.0
