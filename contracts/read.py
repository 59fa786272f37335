"""Read-back: a range of stored content, re-read from the ledger and verified (``ctx.read``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from ._base import SchemaVersion, WireModel, forbidden_shapes
from .ids import Identifier

__all__ = ["READ", "POLICY_REGISTER", "PolicyRegistered", "ReadReply", "ReadRequest"]

READ = "ctx.read"
POLICY_REGISTER = "ctx.policy.register"


class ReadRequest(WireModel):
    """A byte range (``offset``/``length``) or a line range (``line``/``lines``) of ``ctx://blob/<sha256>``."""

    schema_version: SchemaVersion = 1
    session_id: Identifier
    principal_id: Identifier | None = None
    # An externalized output, or one recorded record of the session (what a search hit points at).
    ref: Annotated[
        str,
        Field(
            pattern=r"^ctx://(blob/[0-9a-f]{64}|record/[A-Za-z0-9_-]{1,128}\.[A-Za-z0-9_-]{1,128}/[1-9][0-9]{0,18})$"
        ),
    ]
    offset: Annotated[int, Field(ge=0)] = 0
    length: Annotated[int, Field(gt=0, le=1_048_576)] = 65_536
    line: Annotated[int, Field(ge=1)] | None = None
    lines: Annotated[int, Field(gt=0, le=100_000)] | None = None

    # ``_one_range`` in the schema: both of line and lines, or neither.
    model_config = ConfigDict(
        json_schema_extra=forbidden_shapes(
            {"properties": {"line": {"type": "integer"}, "lines": {"type": "null"}}, "required": ["line"]},
            {"properties": {"line": {"type": "null"}, "lines": {"type": "integer"}}, "required": ["lines"]},
        )
    )

    @model_validator(mode="after")
    def _one_range(self) -> ReadRequest:
        if (self.line is None) != (self.lines is None):
            raise ValueError("a line range needs both line and lines")
        return self


class ReadReply(WireModel):
    """The requested range, with where the content ends and where to continue."""

    schema_version: SchemaVersion = 1
    type: Literal["read"] = "read"
    ref: str
    total_bytes: int
    total_lines: int
    offset: int
    content: str
    next_offset: int | None = None
    line: int | None = None
    next_line: int | None = None
    sha256_verified: bool


class PolicyRegistered(WireModel):
    """The revision a registered policy got; new sessions naming it run under that revision."""

    schema_version: SchemaVersion = 1
    type: Literal["policy_registered"] = "policy_registered"
    name: str
    revision: int
