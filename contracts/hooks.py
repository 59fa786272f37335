"""Context hooks: extensions a platform binds to the stages of context preparation.

A hook set is registered per agent release, like a tool catalog; every registration is a new
revision, and a session uses the revision current when its first event was recorded. A binding
names the hook point, the NATS subject its service answers, how long the fleet waits, what a
failure does, and which categories of content the hook may add (the host's grant).
The version of every hook that touched a context or a summary is recorded with it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from ._base import SchemaVersion, WireModel
from .ids import Identifier
from .prepare import Purpose

__all__ = [
    "AdditionCategory",
    "HOOK_SUBJECT_PATTERN",
    "hook_subject_tenant",
    "HookBinding",
    "HookFailurePolicy",
    "HookPoint",
    "HOOKS",
    "HOOKS_REGISTER",
    "HookSet",
    "HooksRegistered",
]

# Registering a release's hook set: ``ctx.hooks.register.<tenant>`` (HookSet in, HooksRegistered out).
HOOKS_REGISTER = "ctx.hooks.register"
# Where the fleet calls hooks: ``hooks.<tenant>.<name…>`` (HookCall out, HookReply back).
HOOKS = "hooks"
# The subject a hook's service answers: ``hooks.<tenant>.<name…>``, no wildcards. The tenant token
# keeps one tenant's hooks out of another's reach on a closed bus (a tenant's runtime may answer
# ``hooks.<tenant>.>`` only) and lets the fleet's workers send to ``hooks.>`` and nothing else.
HOOK_SUBJECT_PATTERN = r"^hooks(\.[A-Za-z0-9_-]{1,64}){2,15}$"


class HookPoint(StrEnum):
    """Where in the pipeline a hook runs."""

    # Sees candidate blocks; may add authorized material, deselect optional blocks, or reject.
    PREPARE_BEFORE = "context.prepare.before"
    # Sees the prepared context, read-only; may only annotate diagnostics.
    PREPARE_AFTER = "context.prepare.after"
    # Sees the candidate range and summary target; may narrow the range or adjust the target.
    COMPACT_BEFORE = "context.compact.before"
    # Sees the candidate summary; may patch its allowed text fields, validated again before commit.
    COMPACT_AFTER = "context.compact.after"

    @property
    def is_compaction(self) -> bool:
        return self in (HookPoint.COMPACT_BEFORE, HookPoint.COMPACT_AFTER)


class HookFailurePolicy(StrEnum):
    """What a hook's timeout, error or refused change does to the stage it runs in."""

    # The stage goes on without the hook's change (counted in metrics, named in the diagnostics).
    SKIP = "skip"
    # The stage fails with the hook's code: the prepare or compaction answers an error.
    FAIL = "fail"


class AdditionCategory(StrEnum):
    """What a hook may add to a context, as the host grants it; never instructions or required blocks."""

    # Authorized reference material (a policy engine's document excerpt, a retrieval result).
    MATERIAL = "material"
    # A last optional note to the model (a gateway's "answer in the user's language"); it never
    # outranks the release's instructions and is dropped first when the budget is short.
    GUIDANCE = "guidance"


class HookBinding(WireModel):
    """One hook of a release at one point."""

    name: Identifier
    version: Annotated[str, Field(min_length=1, max_length=100)]
    point: HookPoint
    subject: Annotated[str, Field(pattern=HOOK_SUBJECT_PATTERN)]
    timeout_ms: Annotated[int, Field(ge=1, le=30_000)] = 500
    failure: HookFailurePolicy = HookFailurePolicy.SKIP
    # The purposes the hook runs for. The compaction points run for compaction only, and the prepare
    # points never do: a summarizer's context is not an action's ("purpose 过滤").
    purposes: tuple[Purpose, ...] | None = None
    grants: tuple[AdditionCategory, ...] = ()

    @model_validator(mode="after")
    def _purposes_fit_the_point(self) -> HookBinding:
        if self.purposes is not None:
            if not self.purposes:
                raise ValueError("purposes must name at least one purpose, or be omitted")
            if len(set(self.purposes)) != len(self.purposes):
                raise ValueError("purposes must not repeat")
            compaction = Purpose.COMPACTION in self.purposes
            if self.point.is_compaction and self.purposes != (Purpose.COMPACTION,):
                raise ValueError(f"a {self.point.value} hook runs for purpose compaction only")
            if not self.point.is_compaction and compaction:
                raise ValueError(f"a {self.point.value} hook cannot run for purpose compaction")
        if self.grants and self.point is not HookPoint.PREPARE_BEFORE:
            raise ValueError(f"only a {HookPoint.PREPARE_BEFORE.value} hook may be granted additions")
        return self

    @property
    def runs_for(self) -> tuple[Purpose, ...]:
        """The purposes the hook runs for, with the point's default filled in."""
        if self.purposes is not None:
            return self.purposes
        if self.point.is_compaction:
            return (Purpose.COMPACTION,)
        return (Purpose.ACTION,)

    @property
    def source(self) -> str:
        """How the hook's changes are labelled: ``name@version``."""
        return f"{self.name}@{self.version}"


def hook_subject_tenant(subject: str) -> str:
    """The tenant a hook subject belongs to (its second token)."""
    return subject.split(".", 2)[1]


class HookSet(WireModel):
    """The context hooks of one agent release; each registration is a new revision."""

    schema_version: SchemaVersion = 1
    release: Annotated[str, Field(min_length=1, max_length=200)]
    hooks: tuple[HookBinding, ...] = Field(default=(), max_length=32)

    @model_validator(mode="after")
    def _names_are_unique(self) -> HookSet:
        names = [h.name for h in self.hooks]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"hook names must be unique in a release: {', '.join(repeated)}")
        return self


class HooksRegistered(WireModel):
    """The revision a hook set got; sessions of that release started afterwards use it."""

    schema_version: SchemaVersion = 1
    type: Literal["hooks_registered"] = "hooks_registered"
    release: str
    revision: int
