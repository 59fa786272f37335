"""Chaining summaries and rendering them for the model. Pure.

A new compaction never re-summarizes covered records: it summarizes the newly covered segment and
merges it into the parent. Every list is bounded (by a fixed cap or by what the child itself
brings) so repeated merges cannot grow without limit; constraints and modified files are never
dropped, older progress and older actions fold into counts. Shrinking a summary to a token budget
is rollup's job.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from typing import TypeVar

from services.core.compaction.actions import overwrites
from services.core.compaction.model import (
    ActionTaken,
    CommandRun,
    FileTouch,
    FileView,
    SourcedText,
    StepFold,
    StructuredSummary,
    ToolFailure,
    ToolTally,
    cited_seqs,
)

__all__ = [
    "fold_actions",
    "fold_progress",
    "latest_failures",
    "merge_summaries",
    "render_summary",
    "summary_sources",
]

_KEEP_PROGRESS = 40
_KEEP_DECISIONS = 20
_KEEP_FAILURES = 25
_KEEP_UNRESOLVED = 8
_KEEP_COMMANDS = 30
_KEEP_FILES_READ = 60
_KEEP_APPROACHES = 8
_KEEP_REFERENCES = 20
_KEEP_CHANGES = 4
_KEEP_VIEWS = 3
_KEEP_SOURCES = 6
_KEEP_TALLIES = 6
_KEEP_ACTIONS = 40

_T = TypeVar("_T")
# A progress line as the structured summarizer writes it: "name(args) → status: output".
_STEP = re.compile(r"^(?P<name>[^\s(]+)\(.*→ (?P<status>success|error|timeout|unknown)\b", re.S)


def _dedup(items: Iterable[_T]) -> tuple[_T, ...]:
    return tuple(dict.fromkeys(items))


def _cap(sources: Iterable[int]) -> tuple[int, ...]:
    unique = tuple(dict.fromkeys(sources))
    return unique if len(unique) <= _KEEP_SOURCES else (unique[0], *unique[-(_KEEP_SOURCES - 1) :])


def _files(
    a: Sequence[FileTouch], b: Sequence[FileTouch], *, keep: int | None = None
) -> tuple[FileTouch, ...]:
    """Touches per path in first-seen order; ``keep`` bounds how many paths stay (the least recent go)."""
    sources: dict[str, list[int]] = {}
    changes: dict[str, list[SourcedText]] = {}
    views: dict[str, dict[tuple[str, str], list[int]]] = {}
    for touch in (*a, *b):
        sources.setdefault(touch.path, []).extend(touch.sources)
        changes.setdefault(touch.path, []).extend(touch.changes)
        seen = views.setdefault(touch.path, {})
        for view in touch.views:
            key = (view.lines, view.sha)
            # A re-read of the same content moves to the end: the latest reads are kept.
            seen[key] = [*seen.pop(key, []), *view.sources]
    paths = list(sources)
    if keep is not None and len(paths) > keep:
        # The least recently touched paths go; the rest keep their first-seen order.
        recent = set(sorted(paths, key=lambda p: (max(sources[p]), p))[-keep:])
        paths = [p for p in paths if p in recent]
    return tuple(
        FileTouch(
            path=p,
            sources=_cap(sources[p]),
            changes=_dedup(changes[p])[-_KEEP_CHANGES:],
            views=tuple(FileView(lines=r, sha=h, sources=_cap(s)) for (r, h), s in views[p].items())[
                -_KEEP_VIEWS:
            ],
        )
        for p in paths
    )


def _commands(parent: Sequence[CommandRun], child: Sequence[CommandRun]) -> tuple[CommandRun, ...]:
    merged: dict[str, CommandRun] = {c.command: c for c in parent}
    for run in child:
        before = merged.pop(run.command, None)
        merged[run.command] = (
            run
            if before is None
            else run.model_copy(
                update={
                    "runs": before.runs + run.runs,
                    "last_failure": run.last_failure or before.last_failure,
                    "sources": _cap((*before.sources[:1], *run.sources)),
                }
            )
        )
    items = list(merged.values())
    while len(items) > _KEEP_COMMANDS:
        # Drop the oldest command that last succeeded; only failing ones left: the oldest of those.
        index = next((i for i, c in enumerate(items) if c.status == "success"), 0)
        del items[index]
    return tuple(items)


def _failures(
    parent: Sequence[ToolFailure], child: StructuredSummary, keep_from: int | None
) -> tuple[ToolFailure, ...]:
    """Parent failures (cleared by a child success of the same command), then all of the child's.

    Past the cap the oldest parent failures fall off, but never one recorded at or after
    ``keep_from``: a job summarizing in several segments merges its own earlier segments as the
    parent, and the validator holds every failure of the job's range to be listed.
    """
    succeeded = {c.command: c.sources[-1] for c in child.commands if c.status == "success"}
    cleared = tuple(
        f.model_copy(update={"cleared_at": succeeded[f.command]})
        if f.cleared_at is None and f.command in succeeded
        else f
        for f in parent
    )
    own = {(f.call_id, f.status) for f in child.failures}
    older = [f for f in cleared if (f.call_id, f.status) not in own]
    droppable = [i for i, f in enumerate(older) if keep_from is None or f.sources[-1] < keep_from]
    kept = len(older) - len(droppable)
    excess = min(len(droppable), len(older) - max(kept, _KEEP_FAILURES - len(child.failures)))
    if excess > 0:
        # What falls off first: failures already cleared, then the oldest.
        ranked = sorted(droppable, key=lambda i: (older[i].cleared_at is None, i))
        dropped = set(ranked[:excess])
        older = [f for i, f in enumerate(older) if i not in dropped]
    return (*older, *child.failures)


def _tallies(steps: Iterable[SourcedText], base: Sequence[ToolTally] = ()) -> tuple[ToolTally, ...]:
    counts: dict[str, list[int]] = {t.name: [t.runs, t.failed] for t in base}
    for step in steps:
        found = _STEP.match(step.text)
        name = (
            found["name"]
            if found
            else step.text.split(":", 1)[0]
            if step.text.startswith("replied:")
            else "other"
        )
        tally = counts.setdefault(name, [0, 0])
        tally[0] += 1
        tally[1] += 1 if found and found["status"] != "success" else 0
    return _ranked(counts)


def _ranked(counts: dict[str, list[int]]) -> tuple[ToolTally, ...]:
    """The most frequent tools by name, the rest as one "other" tally (bounded whatever the thread)."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1][0], kv[0]))
    head, rest = ranked[: _KEEP_TALLIES - 1], ranked[_KEEP_TALLIES - 1 :]
    if len(rest) > 1:
        head.append(("other", [sum(r for _, (r, _f) in rest), sum(f for _, (_r, f) in rest)]))
    else:
        head += rest
    return tuple(ToolTally(name=n, runs=r, failed=f) for n, (r, f) in head)


def fold_progress(summary: StructuredSummary, keep: int) -> StructuredSummary:
    """Fold all but the newest ``keep`` progress lines into the summary's counts."""
    if len(summary.progress) <= keep:
        return summary
    cut = len(summary.progress) - keep
    older, newer = summary.progress[:cut], summary.progress[cut:]
    seqs = [s for item in older for s in item.sources]
    before = summary.folded
    folded = StepFold(
        first=min(seqs + ([before.first] if before else [])),
        last=max(seqs + ([before.last] if before else [])),
        steps=len(older) + (before.steps if before else 0),
        tools=_tallies(older, before.tools if before else ()),
    )
    return summary.model_copy(update={"progress": newer, "folded": folded})


def _superseded(actions: Sequence[ActionTaken]) -> set[int]:
    """Indexes of successful overwrites a later success of the same tool on the same target made moot."""
    later: set[tuple[str, str]] = set()
    moot: set[int] = set()
    for i in range(len(actions) - 1, -1, -1):
        action = actions[i]
        if action.status != "success" or not action.target or not overwrites(action.tool):
            continue
        key = (action.tool, action.target)
        if key in later:
            moot.add(i)
        later.add(key)
    return moot


def fold_actions(
    summary: StructuredSummary, keep: int | None, *, superseded: bool = False
) -> StructuredSummary:
    """Fold all but the newest ``keep`` actions (``None``: no bound) into one counted range;
    ``superseded`` ones fold first."""
    actions = summary.actions
    moot = _superseded(actions) if superseded else set()
    survivors = [i for i in range(len(actions)) if i not in moot]
    fold = moot | set(survivors[: max(0, len(survivors) - keep)] if keep is not None else ())
    if not fold:
        return summary
    older = [actions[i] for i in sorted(fold)]
    seqs = [s for a in older for s in a.sources]
    before = summary.actions_folded
    counts: dict[str, list[int]] = {t.name: [t.runs, t.failed] for t in (before.tools if before else ())}
    for action in older:
        tally = counts.setdefault(action.tool, [0, 0])
        tally[0] += 1
        tally[1] += action.status != "success"
    folded = StepFold(
        first=min(seqs + ([before.first] if before else [])),
        last=max(seqs + ([before.last] if before else [])),
        steps=len(older) + (before.steps if before else 0),
        tools=_ranked(counts),
    )
    kept = tuple(a for i, a in enumerate(actions) if i not in fold)
    return summary.model_copy(update={"actions": kept, "actions_folded": folded})


def _merge_folds(a: StepFold | None, b: StepFold | None) -> StepFold | None:
    if a is None or b is None:
        return a or b
    counts: dict[str, list[int]] = {}
    for tally in (*a.tools, *b.tools):
        entry = counts.setdefault(tally.name, [0, 0])
        entry[0] += tally.runs
        entry[1] += tally.failed
    tools = _tallies((), tuple(ToolTally(name=n, runs=r, failed=f) for n, (r, f) in counts.items()))
    return StepFold(
        first=min(a.first, b.first), last=max(a.last, b.last), steps=a.steps + b.steps, tools=tools
    )


def _by_text(items: Iterable[SourcedText]) -> tuple[SourcedText, ...]:
    """One item per text (a repeated constraint keeps its first words and all its citations)."""
    merged: dict[str, list[int]] = {}
    for item in items:
        merged.setdefault(item.text, []).extend(item.sources)
    return tuple(SourcedText(text=t, sources=_cap(s)) for t, s in merged.items())


def merge_summaries(
    parent: StructuredSummary | None, child: StructuredSummary, *, keep_failures_from: int | None = None
) -> StructuredSummary:
    """``child`` continues ``parent``: one summary covering both ranges.

    ``keep_failures_from``: the first seq of the compaction job, whose failures all stay (see
    ``_failures``).
    """
    if parent is None:
        return fold_actions(fold_progress(child, _KEEP_PROGRESS), _KEEP_ACTIONS)
    merged = StructuredSummary(
        # A request that was current when the parent was made precedes its range; covered now, it
        # widens the range down.
        covered_from=min(parent.covered_from, child.covered_from),
        covered_to=child.covered_to,
        goal=parent.goal or child.goal,
        current_request=child.current_request or parent.current_request,
        constraints=_by_text((*parent.constraints, *child.constraints)),
        decisions=_dedup((*parent.decisions, *child.decisions))[-_KEEP_DECISIONS:],
        progress=_dedup((*parent.progress, *child.progress)),
        files_read=_files(parent.files_read, child.files_read, keep=_KEEP_FILES_READ),
        files_modified=_files(parent.files_modified, child.files_modified),
        failures=_failures(parent.failures, child, keep_failures_from),
        unresolved=_dedup((*parent.unresolved, *child.unresolved))[-_KEEP_UNRESOLVED:],
        next_steps=child.next_steps or parent.next_steps,
        references=_dedup((*parent.references, *child.references))[-_KEEP_REFERENCES:],
        commands=_commands(parent.commands, child.commands),
        approaches_failed=_dedup((*parent.approaches_failed, *child.approaches_failed))[-_KEEP_APPROACHES:],
        hypothesis=child.hypothesis or parent.hypothesis,
        folded=_merge_folds(parent.folded, child.folded),
        actions=(*parent.actions, *child.actions),
        actions_folded=_merge_folds(parent.actions_folded, child.actions_folded),
    )
    return fold_actions(fold_progress(merged, _KEEP_PROGRESS), _KEEP_ACTIONS)


def latest_failures(summary: StructuredSummary) -> tuple[ToolFailure, ...]:
    """Failures still in force: not cleared by a later success, and the newest of their command."""
    newest: dict[str, ToolFailure] = {}
    for failure in summary.failures:
        key = failure.command or f"{failure.name} {failure.call_id}"
        newest.pop(key, None)
        newest[key] = failure
    return tuple(f for f in newest.values() if f.cleared_at is None)


def summary_sources(summary: StructuredSummary) -> list[int]:
    """Every record seq the summary cites, sorted, once each."""
    return sorted(set(cited_seqs(summary)))


def _cite(sources: Sequence[int]) -> str:
    return "seq " + ",".join(str(s) for s in sources)


def _fold_line(fold: StepFold, noun: str = "step") -> str:
    tools = ", ".join(
        f"{t.name} ×{t.runs}" + (f" ({t.failed} failed)" if t.failed else "") for t in fold.tools
    )
    steps = f"{fold.steps} {noun}" + ("" if fold.steps == 1 else "s")
    return f"- records {fold.first}–{fold.last}: {steps}" + (f" — {tools}" if tools else "")


def _action_line(action: ActionTaken) -> str:
    status = "ok" if action.status == "success" else action.status
    result = f": {_clip(action.result, 160)}" if action.result else ""
    return f"- {action.tool} {action.args} → {status}{result} ({_cite(action.sources)})"


def _file_line(touch: FileTouch) -> str:
    parts = [f"{c.text} ({_cite(c.sources)})" for c in touch.changes]
    parts += [
        " ".join(p for p in (v.lines, f"#{v.sha}" if v.sha else "") if p) + f" ({_cite(v.sources)})"
        for v in touch.views
    ]
    return f"- {touch.path}: " + "; ".join(parts) if parts else f"- {touch.path} ({_cite(touch.sources)})"


def _command_line(run: CommandRun) -> str:
    status = "ok" if run.status == "success" else run.status
    text = f"- `{_clip(run.command, 120)}` ×{run.runs} last {status}"
    if run.last_failure and run.status == "success":
        text += f" (failed before: {run.last_failure})"  # a still-failing one is under latest failures
    return f"{text} ({_cite(run.sources)})"


def _failed_call(failure: ToolFailure) -> str:
    # The command says more to the model than an opaque call id; the id stays in the stored body.
    return (
        f"{failure.name} `{_clip(failure.command, 60)}`"
        if failure.command
        else f"{failure.name} {failure.call_id}"
    )


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _texts(title: str, items: Sequence[SourcedText]) -> list[str]:
    return [f"{title}:", *(f"- {i.text} ({_cite(i.sources)})" for i in items)] if items else []


def render_summary(
    summary: StructuredSummary, *, revision: int, pinned: Collection[int] = (), continues: int | None = None
) -> str:
    """The summary as the model reads it: labelled as derived history, every line with its sources.

    ``pinned``: seqs of records every context shows verbatim beside the summary (the run's task).
    ``continues``: the revision of the summary part this one follows in the context (it covers only
    what that part did not, and says so in its header); ``None`` for a summary standing alone.
    """
    continued = "" if continues is None else f", continuing r{continues}"
    newer = "" if continues is None else "; where it and the part above differ, this part is newer"
    lines = [
        f"[context summary r{revision}{continued}: records {summary.covered_from}–{summary.covered_to} "
        f"condensed{newer}, derived from the ledger where the originals stay readable; (seq N) cites "
        "the source records]"
    ]
    request = summary.current_request
    shown_in_full = set(pinned) | set(request.sources if request is not None else ())
    goal = summary.goal
    if goal and (request is None or goal.sources != request.sources):
        if set(goal.sources) <= set(pinned):
            lines.append(f"Goal: record {goal.sources[0]}, shown in full outside this summary")
        else:
            lines.append(f"Goal: {goal.text[:400]} ({_cite(goal.sources)})")
    if request is not None:
        # The current request is always shown from its own record; the summary only points to it.
        lines.append(f"Current request: record {request.sources[0]}, shown in full outside this summary")
    # Constraints quoted by a record in view in full (the request, the run's task) are in view with
    # it: quoting them twice is waste.
    lines += _texts(
        "Constraints (quoted)", [c for c in summary.constraints if not set(c.sources) <= shown_in_full]
    )
    if summary.actions or summary.actions_folded:
        # What the agent already changed in the world: without it a later step may do it again.
        lines.append("Actions taken (side effects already done, oldest first):")
        lines += [_fold_line(summary.actions_folded, "earlier action")] if summary.actions_folded else []
        lines += [_action_line(a) for a in summary.actions]
    if summary.hypothesis:
        lines.append(f"Hypothesis: {summary.hypothesis.text} ({_cite(summary.hypothesis.sources)})")
    lines += _texts("Decisions", summary.decisions)
    lines += _texts("Approaches that failed", summary.approaches_failed)
    if summary.progress or summary.folded:
        lines.append("Progress:")
        lines += [_fold_line(summary.folded)] if summary.folded else []
        lines += [f"- {i.text} ({_cite(i.sources)})" for i in summary.progress]
    if any(t.changes for t in summary.files_modified):
        lines.append("Files modified:")
        lines += [_file_line(t) for t in summary.files_modified]
    elif summary.files_modified:
        lines.append(
            "Files modified: " + "; ".join(f"{t.path} ({_cite(t.sources)})" for t in summary.files_modified)
        )
    if summary.files_read:
        if any(t.views for t in summary.files_read):
            lines.append("Files read:")
            lines += [_file_line(t) for t in summary.files_read]
        else:
            lines.append(
                "Files read: " + "; ".join(f"{t.path} ({_cite(t.sources)})" for t in summary.files_read)
            )
    # A command that ran once is its progress line (or part of the folded counts) and, if it
    # failed, its line under latest failures: listing it here too would say it twice.
    telling = [c for c in summary.commands if c.runs > 1 or c.last_failure and c.status == "success"]
    if telling:
        lines.append("Commands repeated or failed:")
        lines += [_command_line(c) for c in telling]
    open_failures = latest_failures(summary)
    if open_failures:
        lines.append("Latest failures:")
        lines += [f"- {_failed_call(f)} {f.status}: {f.detail} ({_cite(f.sources)})" for f in open_failures]
    closed = [f for f in summary.failures if f not in open_failures]
    if closed:
        lines.append(
            "Earlier failures, since succeeded or retried: "
            + "; ".join(f"{_failed_call(f)} ({_cite(f.sources)})" for f in closed)
        )
    lines += _texts("Unresolved", summary.unresolved)
    lines += _texts("Next steps", summary.next_steps)
    if summary.references:
        lines.append("Externalized results: " + ", ".join(summary.references))
    return "\n".join(lines)
