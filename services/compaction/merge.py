"""Chaining summaries and rendering them for the model. Pure.

A new compaction never re-summarizes covered records: it summarizes the newly covered segment and
merges it into the parent. Lists are bounded so a long-lived thread's summary cannot grow without
limit; constraints and modified files are never dropped, older progress collapses into a count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from .model import FileTouch, SourcedText, StructuredSummary

__all__ = ["merge_summaries", "render_summary", "summary_sources"]

_KEEP_PROGRESS = 40
_KEEP_DECISIONS = 20
_KEEP_FAILURES = 25
_KEEP_UNRESOLVED = 8

_T = TypeVar("_T")


def _dedup(items: Sequence[_T]) -> tuple[_T, ...]:
    return tuple(dict.fromkeys(items))


def _files(a: Sequence[FileTouch], b: Sequence[FileTouch]) -> tuple[FileTouch, ...]:
    merged: dict[str, list[int]] = {}
    for touch in (*a, *b):
        merged.setdefault(touch.path, []).extend(touch.sources)
    return tuple(FileTouch(path=p, sources=tuple(dict.fromkeys(s))) for p, s in merged.items())


def _bounded_progress(items: Sequence[SourcedText]) -> tuple[SourcedText, ...]:
    if len(items) <= _KEEP_PROGRESS:
        return tuple(items)
    dropped = items[: len(items) - _KEEP_PROGRESS + 1]
    seqs = sorted({s for item in dropped for s in item.sources})
    head = SourcedText(text=f"{len(dropped)} earlier steps (records {seqs[0]}–{seqs[-1]}; readable in the ledger)", sources=(seqs[0], seqs[-1]))
    return (head, *items[len(items) - _KEEP_PROGRESS + 1 :])


def merge_summaries(parent: StructuredSummary | None, child: StructuredSummary) -> StructuredSummary:
    """``child`` continues ``parent``: one summary covering both ranges."""
    if parent is None:
        return child.model_copy(update={"progress": _bounded_progress(child.progress)})
    return StructuredSummary(
        covered_from=parent.covered_from,
        covered_to=child.covered_to,
        goal=parent.goal or child.goal,
        current_request=child.current_request or parent.current_request,
        constraints=_dedup((*parent.constraints, *child.constraints)),
        decisions=_dedup((*parent.decisions, *child.decisions))[-_KEEP_DECISIONS:],
        progress=_bounded_progress(_dedup((*parent.progress, *child.progress))),
        files_read=_files(parent.files_read, child.files_read),
        files_modified=_files(parent.files_modified, child.files_modified),
        failures=_dedup((*parent.failures, *child.failures))[-_KEEP_FAILURES:],
        unresolved=_dedup((*parent.unresolved, *child.unresolved))[-_KEEP_UNRESOLVED:],
        next_steps=child.next_steps or parent.next_steps,
        references=_dedup((*parent.references, *child.references)),
    )


def summary_sources(summary: StructuredSummary) -> list[int]:
    """Every record seq the summary cites, sorted, once each."""
    seqs: set[int] = set()
    for item in (summary.goal, summary.current_request):
        if item is not None:
            seqs.update(item.sources)
    for group in (summary.constraints, summary.decisions, summary.progress, summary.unresolved, summary.next_steps):
        for text in group:
            seqs.update(text.sources)
    for touches in (summary.files_read, summary.files_modified):
        for touch in touches:
            seqs.update(touch.sources)
    for failure in summary.failures:
        seqs.update(failure.sources)
    return sorted(seqs)


def _cite(sources: Sequence[int]) -> str:
    return "seq " + ", ".join(str(s) for s in sources)


def render_summary(summary: StructuredSummary, *, revision: int) -> str:
    """The summary as the model reads it: labelled as derived history, every line with its sources."""
    lines = [
        f"[context summary r{revision}: records {summary.covered_from}–{summary.covered_to} condensed; "
        "the original records remain readable in the ledger]"
    ]
    request = summary.current_request
    if summary.goal and (request is None or summary.goal.sources != request.sources):
        lines.append(f"Goal: {summary.goal.text[:400]} ({_cite(summary.goal.sources)})")
    if request is not None:
        # The current request is always shown from its own record; the summary only points to it.
        lines.append(f"Current request: record {request.sources[0]}, shown in full after this summary")
    sections: list[tuple[str, Sequence[SourcedText]]] = [
        ("Constraints (quoted)", summary.constraints),
        ("Decisions", summary.decisions),
        ("Progress", summary.progress),
    ]
    for title, items in sections:
        if items:
            lines.append(f"{title}:")
            lines += [f"- {i.text} ({_cite(i.sources)})" for i in items]
    for title, touches in (("Files read", summary.files_read), ("Files modified", summary.files_modified)):
        if touches:
            lines.append(f"{title}: " + "; ".join(f"{t.path} ({_cite(t.sources)})" for t in touches))
    if summary.failures:
        lines.append("Failures:")
        lines += [f"- {f.name} {f.call_id} {f.status}: {f.detail} ({_cite(f.sources)})" for f in summary.failures]
    for title, items in (("Unresolved", summary.unresolved), ("Next steps", summary.next_steps)):
        if items:
            lines.append(f"{title}:")
            lines += [f"- {i.text} ({_cite(i.sources)})" for i in items]
    if summary.references:
        lines.append("Externalized results: " + ", ".join(summary.references))
    return "\n".join(lines)
