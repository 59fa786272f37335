"""Search: navigation over everything a session recorded; evidence comes back through the ledger."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, model_validator

from ._base import SchemaVersion, Timestamp, WireModel

__all__ = ["SEARCH", "SearchHit", "SearchReply", "SearchRequest"]

SEARCH = "ctx.search"
_ID = r"^[A-Za-z0-9_-]{1,128}$"


class SearchRequest(WireModel):
    """Full-text search within one session (optionally one run or thread, some kinds, a time range)."""

    schema_version: SchemaVersion = 1
    session_id: Annotated[str, Field(pattern=_ID)]
    principal_id: Annotated[str, Field(pattern=_ID)] | None = None
    query: Annotated[str, Field(min_length=1, max_length=500)]
    run_id: Annotated[str, Field(pattern=_ID)] | None = None
    thread_id: str | None = None
    kinds: tuple[str, ...] = ()
    # Recorded at or after ``since`` and before ``until`` (the fleet's clock, not the runtime's).
    since: Timestamp | None = None
    until: Timestamp | None = None
    limit: Annotated[int, Field(ge=1, le=200)] = 20

    @model_validator(mode="after")
    def _range_is_ordered(self) -> SearchRequest:
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise ValueError("until must be after since")
        return self


class SearchHit(WireModel):
    """Where the text is — a pointer to read back, not evidence by itself."""

    thread_id: str
    seq: int
    kind: str
    event_key: str
    recorded_at: datetime
    snippet: str
    start_byte: int
    end_byte: int
    start_line: int
    end_line: int
    rank: float
    superseded: bool


class SearchReply(WireModel):
    """The hits, best first."""

    schema_version: SchemaVersion = 1
    type: Literal["search"] = "search"
    hits: tuple[SearchHit, ...]
