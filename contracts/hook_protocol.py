"""What the fleet sends a context hook and what the hook may answer.

The fleet sends a ``HookCall`` as a NATS request to the binding's subject and waits up to its
timeout for a ``HookReply``. A hook answers ``continue`` (no change), ``patch`` (the changes its
point allows) or ``reject`` (the stage fails with its reason). What a point allows:

- ``context.prepare.before``: ``add`` material of a granted category, ``deselect`` optional blocks;
- ``context.prepare.after``: ``annotations`` only (the context is read-only by then);
- ``context.compact.before``: ``narrow_to`` a shorter range, ``summary_target_tokens``;
- ``context.compact.after``: ``summary_fields`` — the allowed text fields of the candidate summary.

Anything else a patch carries (``edit`` of a block's text, a deselected required block, an
ungranted addition …) is refused with ``hook_change_refused``: the stage goes on without the
change (policy ``skip``) or fails (policy ``fail``). Nothing a hook returns is an instruction.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, JsonValue

from ._base import SchemaVersion, WireModel
from .hooks import AdditionCategory, HookPoint
from .prepare import BlockKind, Purpose, Retention

__all__ = [
    "HookAddition",
    "HookAnnotation",
    "HookBlock",
    "HookBlockEdit",
    "HookCall",
    "HookDecision",
    "HookPatch",
    "HookRange",
    "HookReply",
    "SUMMARY_PATCH_FIELDS",
]

# The fields of a structured summary a compact.after hook may replace. The patched summary passes the
# compaction's validation again, so a patch that drops a file write, a failure or an action fails it;
# the covered range and the current request (taken from its own record) are never the hook's.
SUMMARY_PATCH_FIELDS = (
    "goal",
    "constraints",
    "decisions",
    "progress",
    "files_read",
    "files_modified",
    "failures",
    "unresolved",
    "next_steps",
    "references",
    "commands",
    "approaches_failed",
    "hypothesis",
    "actions",
)


class HookDecision(StrEnum):
    CONTINUE = "continue"
    PATCH = "patch"
    REJECT = "reject"


class HookBlock(WireModel):
    """A candidate block as a prepare.before hook sees it (or a kept block, for prepare.after)."""

    block_id: str
    kind: BlockKind
    retention: Retention
    tokens: int
    text: str


class HookRange(WireModel):
    """A range of ledger records (inclusive)."""

    from_seq: Annotated[int, Field(ge=0)]
    to_seq: Annotated[int, Field(ge=0)]


class HookCall(WireModel):
    """What the fleet sends a hook; the scope and purpose are read-only."""

    schema_version: SchemaVersion = 1
    type: Literal["hook_call"] = "hook_call"
    point: HookPoint
    hook: str
    tenant: str
    session_id: str
    thread_id: str
    purpose: Purpose
    # prepare.before: the candidate blocks; prepare.after: the blocks of the prepared context.
    blocks: tuple[HookBlock, ...] = ()
    prepared_id: str | None = None
    # compact.before: the candidate range and the summary's target size; compact.after: the range.
    range: HookRange | None = None
    summary_target_tokens: int | None = None
    # compact.after: the candidate summary (structured, as the validator sees it).
    summary: dict[str, JsonValue] | None = None


class HookAddition(WireModel):
    """Material a prepare.before hook adds; counted in the budget like any material, droppable."""

    category: AdditionCategory
    title: Annotated[str, Field(min_length=1, max_length=200)]
    text: Annotated[str, Field(min_length=1, max_length=200_000)]


class HookBlockEdit(WireModel):
    """A change of a block's text: never allowed — listed so that asking for one is refused by name."""

    block_id: str
    text: str


class HookAnnotation(WireModel):
    """A diagnostic note a prepare.after hook attaches to the prepared context."""

    text: Annotated[str, Field(min_length=1, max_length=2_000)]


class HookPatch(WireModel):
    add: tuple[HookAddition, ...] = Field(default=(), max_length=16)
    deselect: tuple[str, ...] = ()
    edit: tuple[HookBlockEdit, ...] = ()
    annotations: tuple[HookAnnotation, ...] = Field(default=(), max_length=16)
    narrow_to: HookRange | None = None
    summary_target_tokens: Annotated[int, Field(gt=0)] | None = None
    summary_fields: dict[str, JsonValue] | None = None


class HookReply(WireModel):
    """A hook's answer."""

    schema_version: SchemaVersion = 1
    type: Literal["hook_reply"] = "hook_reply"
    decision: HookDecision = HookDecision.CONTINUE
    reason: Annotated[str, Field(max_length=2_000)] = ""
    patch: HookPatch = HookPatch()
