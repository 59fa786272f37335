"""Managing a thread's context by hand: a manual compaction (``/compact``).

``ctx.compact.<tenant>.<run>.<instance>`` (request/reply) takes a :class:`CompactRequest` and answers a
:class:`CompactReply` or an ``ErrorReply``: ``thread_not_found`` (also for another tenant's thread),
``nothing_to_compact`` or ``compaction_failed``. The compactor serves it, so a manual compaction
runs where automatic ones do and never on the assembler's hot path.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from ._base import SchemaVersion, WireModel
from .ids import Identifier, split_thread_id
from .subjects import check_tenant

__all__ = ["COMPACT", "CompactReply", "CompactRequest", "compact_subject"]

COMPACT = "ctx.compact"


def compact_subject(tenant: str, thread_id: str) -> str:
    """Where a client of ``tenant`` asks for the manual compaction of ``thread_id`` (request/reply)."""
    split_thread_id(thread_id)
    return f"{COMPACT}.{check_tenant(tenant)}.{thread_id}"


class CompactRequest(WireModel):
    """Compact thread ``(run_id, instance_id)`` now, whatever the budgeter's triggers say.

    Everything the policy lets go is covered (its ``keep_recent_groups`` stay verbatim); the thread's
    scope is checked as a prepare checks it: a ``session_id`` or ``principal_id`` that does not own the
    thread makes it look missing.
    """

    schema_version: SchemaVersion = 1
    run_id: Identifier
    instance_id: Identifier
    session_id: Identifier | None = None
    # Required when the thread's session has a principal, as for prepare.
    principal_id: Identifier | None = None


class CompactReply(WireModel):
    """A committed manual compaction: the new summary, and the view's tokens before and after it."""

    schema_version: SchemaVersion = 1
    type: Literal["compacted"] = "compacted"
    thread_id: str
    summary_id: str
    view_revision: Annotated[int, Field(ge=1)]
    # The records the summary now stands for (session seqs, inclusive).
    covered_from: int
    covered_to: int
    # The view's estimated input (history, summary, the tool schemas prepares send) under
    # ``input_budget``, as the budgeter measures it.
    tokens_before: int
    tokens_after: int
    input_budget: int
    target_reached: bool
    summarizer: str
    calls: int
