"""Branches of a session: forking it at a seq (``ctx.session.fork``) and exporting it as a trace
(``ctx.session.export``).

A fork is a new session whose history is its parent's up to ``at_seq``, by reference (invariant
11: nothing the fork records, compacts or projects changes the parent). An export is the
session's history in the trace format ``ctxfleet replay`` reads (docs/trace-format.md), sent in pages
because a reply has a size limit.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ._base import SchemaVersion, WireModel
from .subjects import check_tenant, check_token
from .ids import Identifier

__all__ = [
    "EXPORT_MAX_BYTES",
    "SESSION_EXPORT",
    "SESSION_FORK",
    "ExportPage",
    "ExportRequest",
    "ForkRequest",
    "SessionForked",
    "session_export_subject",
]

SESSION_FORK = "ctx.session.fork"
SESSION_EXPORT = "ctx.session.export"
# Far below any NATS max_payload a fleet runs with (1 MiB is the server's default), JSON escaping
# and the envelope included: a longer line is sent in several pages.
EXPORT_MAX_BYTES = 262_144


def session_export_subject(tenant: str, session_id: str) -> str:
    """Where an operator asks for a page of the export of a session of ``tenant``."""
    return f"{SESSION_EXPORT}.{check_tenant(tenant)}.{check_token(session_id, 'session id')}"


class ForkRequest(WireModel):
    """Start session ``new_session_id`` from the history of ``session_id`` up to session seq ``at_seq``.

    Idempotent: asking again for the same fork (same id, parent and seq) answers the fork that
    exists; any other use of an existing session id is ``session_exists``.
    """

    schema_version: SchemaVersion = 1
    session_id: Identifier
    at_seq: Annotated[int, Field(ge=1)]
    new_session_id: Identifier
    # A session pinned to a principal is visible only to it, as for read-backs and prepares.
    principal_id: Identifier | None = None


class SessionForked(WireModel):
    """The fork: its parent, the seq it branched at, and where its own records begin."""

    schema_version: SchemaVersion = 1
    type: Literal["session_forked"] = "session_forked"
    session_id: str
    parent_session_id: str
    at_seq: int
    # The fork's first own record gets this session seq: parent and fork seqs never collide.
    next_seq: int
    # Records at or below this seq are outside the fork's context (a reset the history holds).
    reset_seq: int
    created: bool


class ExportRequest(WireModel):
    """A page of the export: the trace lines after session seq ``after_seq`` (skipping ``offset``
    characters of the first one, when the previous page ended inside it)."""

    schema_version: SchemaVersion = 1
    after_seq: Annotated[int, Field(ge=0)] = 0
    offset: Annotated[int, Field(ge=0)] = 0
    max_bytes: Annotated[int, Field(ge=4096, le=EXPORT_MAX_BYTES)] = EXPORT_MAX_BYTES


class ExportPage(WireModel):
    """JSONL text of the trace (whole lines, or a part of one long line) and where to continue."""

    schema_version: SchemaVersion = 1
    type: Literal["session_export"] = "session_export"
    session_id: str
    chunk: str
    # ``None`` when the export is complete; otherwise ask again with these.
    next_after_seq: int | None = None
    next_offset: int = 0
