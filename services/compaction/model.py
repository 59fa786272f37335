"""The structured summary a compaction produces, and the port every summarizer implements.

A summary is a typed projection of covered records, never free text alone: every statement keeps
the seqs of the records it came from, identifiers are copied verbatim, and tool failures and file
writes have their own fields so validation can check them against the covered records.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ..records import LedgerRecord

__all__ = [
    "FileTouch",
    "Segment",
    "SegmentTooLong",
    "SourcedText",
    "StructuredSummary",
    "Summarizer",
    "SummarizerFailed",
    "ToolFailure",
]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourcedText(_Frozen):
    """A statement and the seqs of the records that support it."""

    text: str = Field(min_length=1)
    sources: tuple[int, ...] = Field(min_length=1)


class FileTouch(_Frozen):
    """A file read or modified, with the records that show it."""

    path: str = Field(min_length=1)
    sources: tuple[int, ...] = Field(min_length=1)


class ToolFailure(_Frozen):
    """A tool call that did not succeed, with its real status."""

    call_id: str
    name: str
    status: Literal["error", "timeout", "unknown"]
    detail: str
    sources: tuple[int, ...] = Field(min_length=1)


class StructuredSummary(_Frozen):
    """What future steps still need from the covered records (seed 003 §7, seed 000 §6)."""

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
