"""The structured summary a compaction produces, and the port every summarizer implements.

A summary is a typed projection of covered records, never free text alone: every statement keeps
the seqs of the records it came from, identifiers are copied verbatim, and tool failures and file
writes have their own fields so validation can check them against the covered records.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from services.core.records import LedgerRecord

__all__ = [
    "ActionTaken",
    "CommandRun",
    "FileTouch",
    "FileView",
    "Segment",
    "SegmentTooLong",
    "SourcedText",
    "Status",
    "StepFold",
    "StructuredSummary",
    "Summarizer",
    "SummarizerFailed",
    "ToolFailure",
    "ToolTally",
    "cited_seqs",
]

# A tool outcome's status as recorded (contracts.ToolStatus values).
Status = Literal["success", "error", "timeout", "unknown"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourcedText(_Frozen):
    """A statement and the seqs of the records that support it."""

    text: str = Field(min_length=1)
    sources: tuple[int, ...] = Field(min_length=1)


class FileView(_Frozen):
    """What one read of a file showed: the range asked for and a hash of the output."""

    lines: str = ""  # "L10-40", "L1-20", "last 20", "grep 'x'"; "" is the whole file
    sha: str = ""  # sha256[:12] of the output text: equal hashes mean an unchanged re-read
    sources: tuple[int, ...] = Field(min_length=1)


class FileTouch(_Frozen):
    """A file read or modified, with the records that show it."""

    path: str = Field(min_length=1)
    sources: tuple[int, ...] = Field(min_length=1)
    # Modified files: what each edit changed (editor command and target, or the shell command).
    changes: tuple[SourcedText, ...] = ()
    # Read files: the ranges shown and what they contained.
    views: tuple[FileView, ...] = ()


class ToolFailure(_Frozen):
    """A tool call that did not succeed, with its real status."""

    call_id: str
    name: str
    status: Literal["error", "timeout", "unknown"]
    detail: str
    sources: tuple[int, ...] = Field(min_length=1)
    # The tool/command it belongs to (the key a later success of the same call clears it by).
    command: str = ""
    # Seq of a later successful run of the same command: the failure no longer blocks anything.
    cleared_at: int | None = None


class CommandRun(_Frozen):
    """One distinct command or tool call, however often it ran."""

    command: str = Field(min_length=1)
    tool: str
    runs: int
    status: Status
    last_failure: str = ""  # telling line of its last failed run, "" when it never failed
    sources: tuple[int, ...] = Field(min_length=1)


class ActionTaken(_Frozen):
    """A state-changing call of a non-file tool: a side effect the agent already caused."""

    tool: str = Field(min_length=1)
    args: str  # the arguments verbatim as compact JSON (clipped only if huge)
    status: Status
    result: str = ""  # first telling line of the outcome (the new id, the value set, the error)
    call_id: str = ""
    # ``key=value`` of its primary id argument: a later success of the same overwriting tool on it
    # (actions.OVERWRITING_VERBS) supersedes this.
    target: str = ""
    sources: tuple[int, ...] = Field(min_length=1)


class ToolTally(_Frozen):
    """How often one tool ran within folded progress."""

    name: str
    runs: int
    failed: int = 0


class StepFold(_Frozen):
    """Older progress lines folded into counts: records ``first``–``last``, ``steps`` steps."""

    first: int
    last: int
    steps: int
    tools: tuple[ToolTally, ...] = ()


class StructuredSummary(_Frozen):
    """What future steps still need from the covered records."""

    covered_from: int
    covered_to: int
    goal: SourcedText | None = None
    current_request: SourcedText | None = None
    constraints: tuple[SourcedText, ...] = ()
    decisions: tuple[SourcedText, ...] = ()
    progress: tuple[SourcedText, ...] = ()
    files_read: tuple[FileTouch, ...] = ()
    files_modified: tuple[FileTouch, ...] = ()
    failures: tuple[ToolFailure, ...] = ()
    unresolved: tuple[SourcedText, ...] = ()
    next_steps: tuple[SourcedText, ...] = ()
    references: tuple[str, ...] = ()
    commands: tuple[CommandRun, ...] = ()
    approaches_failed: tuple[SourcedText, ...] = ()
    hypothesis: SourcedText | None = None
    folded: StepFold | None = None
    # Side effects already caused, oldest first; older ones fold into counts (never dropped silently).
    actions: tuple[ActionTaken, ...] = ()
    actions_folded: StepFold | None = None


def cited_seqs(model: BaseModel, *, skip: Collection[str] = ()) -> Iterator[int]:
    """Every seq ``model`` cites, at any depth (``skip`` names top-level fields left out)."""
    if isinstance(model, StepFold):
        yield from (model.first, model.last)
        return
    for name in type(model).model_fields:
        if name in skip:
            continue
        value = getattr(model, name)
        if name == "sources" and isinstance(value, tuple):
            yield from (s for s in value if isinstance(s, int))
            continue
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, BaseModel):
                yield from cited_seqs(item)


@dataclass(frozen=True, slots=True)
class Segment:
    """One summarizer call's input: whole tool groups in seq order, and what came before."""

    records: Sequence[LedgerRecord]
    parent: StructuredSummary | None
    instruction: str

    @property
    def first_seq(self) -> int:
        """Seq of the first record in the segment."""
        return self.records[0].seq

    @property
    def last_seq(self) -> int:
        """Seq of the last record in the segment."""
        return self.records[-1].seq


class SegmentTooLong(Exception):
    """The summarizer (or its provider) cannot take a segment this long: halve it and retry."""


class SummarizerFailed(Exception):
    """The summarizer gave no usable summary (malformed, empty, refused); the job fails."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage


class Summarizer(Protocol):
    """Turns one segment into a structured summary of that segment (merging is not its job)."""

    name: str

    async def summarize(self, segment: Segment) -> StructuredSummary:
        """Summarize ``segment.records``; raise SegmentTooLong or SummarizerFailed."""
        ...
