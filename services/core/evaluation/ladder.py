"""The ablation ladder: the same point of one thread, assembled by each rung's core config.

Every rung answers from the same ``LadderPoint`` — the thread's records, the summary the fleet's
compaction committed, the facts its state projection holds — and
assembles with the fleet's own ``assemble_context``; a rung only chooses which of those inputs the
assembler gets and how it may fit them:

| rung | history | summary | state block |
|---|---|---|---|
| A full | everything, never reduced (over the budget = a failed request) | – | – |
| B window | the newest that fit (the assembler drops the oldest history) | – | – |
| C summary | as the fleet fits it | the committed summary | – |
| D state | as C | as C | every current value, without what it superseded |
| F projection | as C | as C | the slice the tools read, with supersession (the fleet's own) |
| G retrieval | as C, plus archived records the search found for the step, as evidence | as C | as F |

The rollover rung (``rollover_rung``) runs the window strategy through the fleet's window functions.
Rung G's evidence is the point's ``archive``: the replay searched the store's index for the current
step and read the archived hits back (``retrieval``), as a runtime does through ``ctx.search``.

A rung is anything with a ``name`` and a ``context(point)``: a rung built elsewhere (the rollover of
the window strategy) plugs in beside these without the scorer changing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Protocol, assert_never

from contracts import PreparedContext, PrepareRequest

from services.core.assemble import Evidence, OverBudgetView, ThreadSnapshot, assemble_context
from services.core.budget import BudgetSpec
from services.core.state import StateView
from services.core.tokens import TokenCounter
from contracts.exceptions import CtxError

__all__ = [
    "CORE_RUNGS",
    "CoreRung",
    "History",
    "LadderContext",
    "LadderPoint",
    "Rung",
    "RungConfig",
    "RungName",
    "StateMode",
    "core_rungs",
]

# Rung A is the history an agent without context management sends: nothing may cut it, so it is
# assembled under a budget no trace reaches and judged against the real one afterwards.
_UNBOUNDED = 1 << 40


class RungName(StrEnum):
    """The rungs the fleet can run from a trace (E, H–J need more than a trace)."""

    FULL = "A-full"
    WINDOW = "B-window"
    SUMMARY = "C-summary"
    STATE = "D-state"
    PROJECTION = "F-projection"
    RETRIEVAL = "G-retrieval"


class History(StrEnum):
    """How a rung's history meets the budget."""

    # Never reduced: over the budget is a failed request.
    ALL = "all"
    # Fitted by the assembler; what still does not fit is dropped, oldest first.
    FIT = "fit"


class StateMode(StrEnum):
    """What a rung shows of the thread's state projection."""

    NONE = "none"
    # Every current value (up to the assembler's cap), without what it superseded.
    MATERIALIZED = "materialized"
    # The slice the requested tools declare they read, each fact with what it superseded.
    PROJECTED = "projected"


@dataclass(frozen=True, slots=True)
class RungConfig:
    """Which inputs of a point the assembler gets."""

    history: History
    summary: bool
    state: StateMode
    # Whether the point's archive (archived records the search found for the step) is shown as evidence.
    archive: bool = False


@dataclass(frozen=True, slots=True)
class LadderPoint:
    """Everything any rung may use at one prepare of one thread."""

    snapshot: ThreadSnapshot
    request: PrepareRequest
    budget: BudgetSpec
    counter: TokenCounter
    # The thread's state projection (facts and aggregate versions), for a rung that hands it over.
    state: StateView | None = None
    # Archived records the fleet's search found for the current step, read back (for rung G).
    archive: tuple[Evidence, ...] = ()


@dataclass(frozen=True, slots=True)
class LadderContext:
    """What a rung sends at a point, or why it sends nothing."""

    prepared: PreparedContext | None
    failure: str | None = None
    # The window the context belongs to (rungs without windows run in one).
    window: int = 1
    # For the first context of a new window: whether the state it shows equals the state before it.
    recovered: bool | None = None


class Rung(Protocol):
    """One rung of the ladder."""

    @property
    def name(self) -> str:
        """How the report names the rung."""
        ...

    def context(self, point: LadderPoint) -> LadderContext:
        """The context the rung sends at ``point``."""
        ...


CORE_RUNGS: dict[RungName, RungConfig] = {
    RungName.FULL: RungConfig(History.ALL, summary=False, state=StateMode.NONE),
    RungName.WINDOW: RungConfig(History.FIT, summary=False, state=StateMode.NONE),
    RungName.SUMMARY: RungConfig(History.FIT, summary=True, state=StateMode.NONE),
    RungName.STATE: RungConfig(History.FIT, summary=True, state=StateMode.MATERIALIZED),
    RungName.PROJECTION: RungConfig(History.FIT, summary=True, state=StateMode.PROJECTED),
    RungName.RETRIEVAL: RungConfig(History.FIT, summary=True, state=StateMode.PROJECTED, archive=True),
}


@dataclass(frozen=True)
class CoreRung:
    """A rung that is a configuration of the fleet's assembler."""

    rung: RungName
    config: RungConfig

    @property
    def name(self) -> str:
        """The rung's letter and name."""
        return self.rung.value

    def context(self, point: LadderPoint) -> LadderContext:
        """Assemble ``point`` as this rung's configuration of the core does."""
        snapshot = self._snapshot(point)
        budget = point.budget
        if self.config.history is History.ALL:
            budget = replace(budget, input_limit=_UNBOUNDED, input_budget=_UNBOUNDED)
        try:
            prepared = assemble_context(
                snapshot,
                point.request,
                budget,
                point.counter,
                allow_drop_history=self.config.history is History.FIT,
            )
        except CtxError as exc:
            return _refused(exc)
        if isinstance(prepared, OverBudgetView):
            return _refused(prepared.error())
        return LadderContext(prepared)

    def _snapshot(self, point: LadderPoint) -> ThreadSnapshot:
        snapshot = point.snapshot
        config = self.config
        if not config.summary:
            snapshot = replace(snapshot, summary=None, covered_to=0, view_revision=0)
        match config.state:
            case StateMode.NONE:
                snapshot = replace(snapshot, facts=())
            case StateMode.MATERIALIZED:
                bare = tuple(replace(f, supersedes=None, superseded_value=None) for f in snapshot.facts)
                snapshot = replace(snapshot, facts=bare, reads={})
            case StateMode.PROJECTED:
                pass
            case _:
                assert_never(config.state)
        if config.archive:
            snapshot = replace(snapshot, evidence=point.archive)
        return snapshot


def _refused(exc: CtxError) -> LadderContext:
    return LadderContext(None, f"{exc.code.value}: {exc.message}")


def core_rungs(names: tuple[RungName, ...] = tuple(RungName)) -> list[Rung]:
    """The rungs for one thread, in ladder order."""
    return [CoreRung(name, CORE_RUNGS[name]) for name in names]
