"""State: typed patches, tool catalogs with declared effects, facts with provenance.

A state is a per-thread projection of the ledger, partitioned into aggregates (the part of a path
before the first dot: ``item:42`` in ``item:42.location``). The only write path is a typed patch —
sent as a ``state_patch`` event, or produced by code from a tool outcome through the effects the
tool declared in its release's catalog.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue

from ._base import SchemaVersion, WireModel

__all__ = [
    "OPERATION_STATUS",
    "OperationReconcilePayload",
    "OperationStatusRequest",
    "Receipt",
    "TOOLS_REGISTER",
    "CatalogRegistered",
    "PatchOp",
    "PathRule",
    "StateKind",
    "StatePatchPayload",
    "ToolCatalog",
    "ToolEffect",
    "ToolSpec",
    "WriteSource",
]

TOOLS_REGISTER = "ctx.tools.register"
OPERATION_STATUS = "ctx.operation.status"

WriteSource = Literal["tool_effect", "user", "model_proposal", "orchestrator"]
StateKind = Literal[
    "tool_fact",
    "goal",
    "preference",
    "business_fact",
    "plan",
    "open_question",
    "audit",
    "constraint",
    "decision",
]
_PATH = r"^[A-Za-z0-9_:\-]+(\.[A-Za-z0-9_\-]+)+$"
_PATTERN = r"^[A-Za-z0-9_:\-{}]+(\.[A-Za-z0-9_\-{}]+)+$"


class PatchOp(WireModel):
    """One operation of a patch. ``value`` null with ``unknown`` true records UNKNOWN, never a guess."""

    op: Literal["set", "clear", "append", "remove", "increment", "replace_if"]
    path: Annotated[str, Field(pattern=_PATH, max_length=300)]
    value: JsonValue = None
    expected: JsonValue = None
    unknown: bool = False
    # Keep the value but say it may no longer hold (e.g. a cache the orchestrator knows is old).
    stale: bool = False


class StatePatchPayload(WireModel):
    """A typed patch: who proposes it, on which aggregate versions, with which evidence."""

    source: Literal["user", "model_proposal", "orchestrator"]
    ops: tuple[PatchOp, ...] = Field(min_length=1, max_length=200)
    based_on_version: dict[str, int] = Field(default_factory=dict)
    evidence: tuple[str, ...] = ()


class PathRule(WireModel):
    """A registered state path pattern (``item:{id}.location``) and what kind of state it holds."""

    pattern: Annotated[str, Field(pattern=_PATTERN, max_length=300)]
    kind: StateKind


class ToolEffect(WireModel):
    """How a tool outcome updates state: ``path`` and ``value`` are templates over args and result.

    Templates are ``{args.NAME}`` / ``{result.NAME}`` (the outcome text parsed as JSON). A path that
    cannot be filled, or a result that is not JSON, writes nothing; a non-success outcome writes the
    path as UNKNOWN (tool success is not world state, and failure is not knowledge either).
    """

    path: Annotated[str, Field(max_length=300)]
    op: Literal["set", "clear", "append", "increment"] = "set"
    value: str = ""


class ToolSpec(WireModel):
    """A tool of an agent release: what it reads, what it changes, whether it is idempotent."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    input_schema: dict[str, JsonValue] = Field(default_factory=dict)
    reads: tuple[str, ...] = ()
    effects: tuple[ToolEffect, ...] = ()
    idempotency: Literal["required", "optional", "none"] = "none"


class ToolCatalog(WireModel):
    """The tools and state paths of one agent release; each registration is a new revision."""

    schema_version: SchemaVersion = 1
    release: Annotated[str, Field(min_length=1, max_length=200)]
    paths: tuple[PathRule, ...] = ()
    tools: tuple[ToolSpec, ...] = ()


class CatalogRegistered(WireModel):
    """The revision a catalog got; sessions of that release started afterwards use it."""

    schema_version: SchemaVersion = 1
    type: Literal["catalog_registered"] = "catalog_registered"
    release: str
    revision: int


class OperationReconcilePayload(WireModel):
    """The orchestrator settles an operation whose outcome was unknown, after checking the world."""

    operation_id: Annotated[str, Field(min_length=1, max_length=200)]
    status: Literal["success", "failed"]
    external_ref: str | None = None
    evidence: str = ""


class OperationStatusRequest(WireModel):
    """A recovering runtime asks what became of an operation before it re-executes anything."""

    schema_version: SchemaVersion = 1
    session_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")]
    principal_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}$")] | None = None
    operation_id: Annotated[str, Field(min_length=1, max_length=200)]


class Receipt(WireModel):
    """The fleet's record of a side-effecting call: requested, then its real outcome (or unknown)."""

    schema_version: SchemaVersion = 1
    type: Literal["receipt"] = "receipt"
    operation_id: str
    thread_id: str
    call_id: str
    tool: str
    request_sha256: str
    status: Literal["requested", "success", "failed", "timeout", "unknown"]
    reconciled_event: str | None = None
    requested_event: str
    finished_event: str | None = None
    response_sha256: str | None = None
    external_ref: str | None = None
