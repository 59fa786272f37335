"""Rolling a summary up until it fits its own share of the input budget. Pure.

A merge appends; this module shrinks. ``fit_summary`` applies a fixed ladder of reductions,
lowest-value detail first, re-counting the rendering after each rung, and stops at the first
that fits. Every rung only removes or folds, never adds, so rolling up the same summary again is
stable and repeated merge → fit cycles stay within the budget: the size converges instead of
growing with the thread. What must survive is kept verbatim on every rung — the task's
identifiers (goal and current request), the user's constraints, the files modified (paths), the
actions taken (state-changing calls, the newest verbatim), the latest failure per tool/command and
the next steps — and ``skeleton`` is exactly that and nothing more: the last rung, and the smallest
summary an assembler may fall back to. Its actions are bounded too (the newest
``SKELETON_ACTIONS``; older and superseded ones as one counted range), so it stays small on a
thread of any length.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from functools import partial

from services.core.compaction.merge import fold_actions, fold_progress, latest_failures, render_summary
from services.core.compaction.model import ActionTaken, FileTouch, StructuredSummary

__all__ = ["SKELETON_ACTIONS", "fit_summary", "rollup_ladder", "skeleton"]

SKELETON_ACTIONS = 12
_Rung = Callable[[StructuredSummary], StructuredSummary]


def skeleton(summary: StructuredSummary) -> StructuredSummary:
    """Only what must survive: task, constraints, files modified (paths), actions, latest failures,
    next steps."""
    acted = fold_actions(summary, SKELETON_ACTIONS, superseded=True)
    return StructuredSummary(
        covered_from=summary.covered_from,
        covered_to=summary.covered_to,
        goal=summary.goal,
        current_request=summary.current_request,
        constraints=summary.constraints,
        files_modified=tuple(FileTouch(path=t.path, sources=t.sources[-1:]) for t in summary.files_modified),
        failures=latest_failures(summary),
        next_steps=summary.next_steps,
        actions=tuple(_brief(a) for a in acted.actions),
        actions_folded=acted.actions_folded,
    )


# In the skeleton an action says what was done to what, not every argument (an editor tool's
# `command` can hold a whole patch): the call itself stays readable in the ledger by its seqs.
_SKELETON_ARGS = 160
_SKELETON_RESULT = 120


def _brief(action: ActionTaken) -> ActionTaken:
    def clip(text: str, limit: int) -> str:
        return text if len(text) <= limit else text[: limit - 1] + "…"

    return action.model_copy(
        update={"args": clip(action.args, _SKELETON_ARGS), "result": clip(action.result, _SKELETON_RESULT)}
    )


def fit_summary(
    summary: StructuredSummary,
    *,
    max_tokens: int,
    count: Callable[[str], int],
    revision: int,
    pinned: Collection[int] = (),
) -> StructuredSummary:
    """``summary`` itself if its rendering fits ``max_tokens``, else the first rung of the ladder
    that fits; the skeleton when none does (even if the skeleton is over: the caller decides).
    ``pinned`` is passed to :func:`render_summary` (records shown in full beside the summary)."""
    if count(render_summary(summary, revision=revision, pinned=pinned)) <= max_tokens:
        return summary
    current = summary
    for rung in rollup_ladder():
        current = rung(current)
        if count(render_summary(current, revision=revision, pinned=pinned)) <= max_tokens:
            return current
    return current


def rollup_ladder() -> tuple[_Rung, ...]:
    """The reductions in the order they are applied (cumulatively), lowest value first;
    the last is the skeleton."""
    return (
        _drop_closed_failures,
        partial(fold_progress, keep=20),
        partial(_trim, decisions=8, unresolved=4),
        _forget_fixed_failures,
        partial(fold_progress, keep=10),
        _reads_as_paths,
        partial(_trim, decisions=4, unresolved=2, approaches=4, references=10),
        partial(fold_progress, keep=4),
        _only_failing_commands,
        partial(_changes, keep=1),
        # An action a later one on the same target replaced says less than the latest one.
        partial(fold_actions, keep=None, superseded=True),
        partial(fold_actions, keep=SKELETON_ACTIONS, superseded=True),
        # Then every optional list halves at once, so the summary keeps as much as the budget allows.
        *(partial(_shrink, keep=n) for n in (16, 8, 4, 2, 1, 0)),
        _no_counts,
        skeleton,
    )


def _drop_closed_failures(summary: StructuredSummary) -> StructuredSummary:
    # A failure a later success of the same command cleared, or a newer failure of it replaced.
    return summary.model_copy(update={"failures": latest_failures(summary)})


def _trim(
    summary: StructuredSummary,
    *,
    decisions: int | None = None,
    unresolved: int | None = None,
    approaches: int | None = None,
    references: int | None = None,
) -> StructuredSummary:
    """Keep the newest ``n`` items of each list named (``None`` leaves it as it is)."""
    limits = {
        "decisions": decisions,
        "unresolved": unresolved,
        "approaches_failed": approaches,
        "references": references,
    }
    update = {name: _newest(getattr(summary, name), n) for name, n in limits.items() if n is not None}
    return summary.model_copy(update=update)


def _newest(items: tuple[object, ...], n: int) -> tuple[object, ...]:
    return items[len(items) - n :] if n < len(items) else items


def _forget_fixed_failures(summary: StructuredSummary) -> StructuredSummary:
    commands = tuple(
        c.model_copy(update={"last_failure": ""}) if c.status == "success" else c for c in summary.commands
    )
    return summary.model_copy(update={"commands": commands})


def _reads_as_paths(summary: StructuredSummary) -> StructuredSummary:
    reads = tuple(t.model_copy(update={"views": ()}) for t in summary.files_read)
    return summary.model_copy(update={"files_read": reads})


def _only_failing_commands(summary: StructuredSummary) -> StructuredSummary:
    return summary.model_copy(
        update={"commands": tuple(c for c in summary.commands if c.status != "success")}
    )


def _changes(summary: StructuredSummary, *, keep: int) -> StructuredSummary:
    modified = tuple(
        t.model_copy(update={"changes": _newest(t.changes, keep)}) for t in summary.files_modified
    )
    return summary.model_copy(update={"files_modified": modified})


def _recent_reads(summary: StructuredSummary, *, keep: int) -> StructuredSummary:
    reads = summary.files_read
    if len(reads) <= keep:
        return summary
    recent = set(sorted(range(len(reads)), key=lambda i: (max(reads[i].sources), i))[len(reads) - keep :])
    return summary.model_copy(update={"files_read": tuple(t for i, t in enumerate(reads) if i in recent)})


def _shrink(summary: StructuredSummary, *, keep: int) -> StructuredSummary:
    """At most ``keep`` items in every optional list (the newest; ``4 × keep`` paths read),
    fewer citations."""
    trimmed = _trim(summary, decisions=keep, unresolved=keep, approaches=keep, references=keep)
    # Paths read are cheap and spare re-reads (Codex #36665): they go slower than the rest.
    trimmed = _recent_reads(fold_progress(trimmed, keep=min(keep, 4)), keep=4 * keep)
    reads = tuple(t.model_copy(update={"sources": t.sources[-1:]}) for t in trimmed.files_read)
    commands = tuple(_newest(trimmed.commands, keep))
    modified = trimmed.files_modified
    if keep <= 1:
        modified = tuple(t.model_copy(update={"changes": (), "sources": t.sources[-1:]}) for t in modified)
    return trimmed.model_copy(update={"commands": commands, "files_modified": modified, "files_read": reads})


def _no_counts(summary: StructuredSummary) -> StructuredSummary:
    return summary.model_copy(update={"commands": (), "folded": None, "hypothesis": None})
