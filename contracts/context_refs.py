"""The refs the context tools read back, and the tools' names: wire forms a runtime's client parses.

``ctx://blob/<sha256>`` names an externalized output (every preview names one);
``ctx://record/<thread_id>/<seq>`` names a recorded record (every search hit names one). A model
passes either to ``context_read``; the client turns it into a ``ReadRequest.ref``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "CONTEXT_READ",
    "CONTEXT_SEARCH",
    "CONTEXT_TOOL_NAMES",
    "BlobRef",
    "ContextRef",
    "RecordRef",
    "parse_ref",
    "record_ref",
]

CONTEXT_READ = "context_read"
CONTEXT_SEARCH = "context_search"
CONTEXT_TOOL_NAMES = frozenset({CONTEXT_READ, CONTEXT_SEARCH})

_BLOB = re.compile(r"ctx://blob/([0-9a-f]{64})")
_RECORD = re.compile(r"ctx://record/([A-Za-z0-9_-]{1,128}\.[A-Za-z0-9_-]{1,128})/([1-9][0-9]{0,18})")


@dataclass(frozen=True, slots=True)
class BlobRef:
    """An externalized output, by the sha256 of its full text."""

    sha256: str

    @property
    def ref(self) -> str:
        """The wire form."""
        return f"ctx://blob/{self.sha256}"


@dataclass(frozen=True, slots=True)
class RecordRef:
    """One recorded record of the session, by its thread and seq (what a search hit points at)."""

    thread_id: str
    seq: int

    @property
    def ref(self) -> str:
        """The wire form."""
        return record_ref(self.thread_id, self.seq)


ContextRef = BlobRef | RecordRef


def record_ref(thread_id: str, seq: int) -> str:
    """``ctx://record/<thread_id>/<seq>``: the ref of a record, as context_read takes it."""
    return f"ctx://record/{thread_id}/{seq}"


def parse_ref(ref: str) -> ContextRef | None:
    """The ref ``ref`` names, or ``None`` when it is neither a blob nor a record ref."""
    if found := _BLOB.fullmatch(ref):
        return BlobRef(found.group(1))
    if found := _RECORD.fullmatch(ref):
        return RecordRef(found.group(1), int(found.group(2)))
    return None
