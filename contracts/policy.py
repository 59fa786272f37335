"""Context policies: the model budget a session works within and when to compact (docs/design.md,
"Budget and compaction triggers").

Policies are registered by name; every registration is a new immutable revision. A session pins
the revision that was current when its first event was recorded, so a changed policy applies to
new sessions only.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from ._base import SchemaVersion, WireModel, forbidden_shapes
from .ids import Identifier
from .prepare import ModelProfile
from .windows import WindowPolicy

__all__ = ["CompactionPolicy", "CompactionTriggers", "ContextPolicy", "DEFAULT_POLICY_NAME"]

DEFAULT_POLICY_NAME = "default"

_Ratio = Annotated[float, Field(gt=0.0, lt=1.0)]


class CompactionTriggers(WireModel):
    """OR-combined triggers, each firing at ``>=``; ``None`` turns a trigger off."""

    context_ratio: _Ratio | None = 0.80
    user_turns: Annotated[int, Field(gt=0)] | None = None
    model_steps: Annotated[int, Field(gt=0)] | None = None

    # ``_at_least_one`` in the schema; an absent context_ratio is its default, so it counts as on.
    model_config = ConfigDict(
        json_schema_extra=forbidden_shapes(
            {
                "properties": {
                    "context_ratio": {"type": "null"},
                    "user_turns": {"type": "null"},
                    "model_steps": {"type": "null"},
                },
                "required": ["context_ratio"],
            },
        )
    )

    @model_validator(mode="after")
    def _at_least_one(self) -> CompactionTriggers:
        if self.context_ratio is None and self.user_turns is None and self.model_steps is None:
            raise ValueError("enable at least one trigger (context_ratio, user_turns or model_steps)")
        return self


class CompactionPolicy(WireModel):
    """When and how far to compact."""

    triggers: CompactionTriggers = Field(default_factory=CompactionTriggers)
    target_context_ratio: _Ratio = 0.50
    max_compaction_calls: Annotated[int, Field(gt=0, le=64)] = 4
    retry_growth_ratio: _Ratio = 0.05
    keep_recent_groups: Annotated[int, Field(ge=0, le=64)] = 2
    # The summary's own budget: a share of the input budget it never grows past (rolled up instead).
    summary_ratio: Annotated[float, Field(ge=0.05, le=0.5)] = 0.25

    @model_validator(mode="after")
    def _target_below_trigger(self) -> CompactionPolicy:
        ratio = self.triggers.context_ratio
        if ratio is not None and self.target_context_ratio >= ratio:
            raise ValueError(
                f"target_context_ratio ({self.target_context_ratio}) must be below context_ratio ({ratio})"
            )
        if self.summary_ratio >= self.target_context_ratio:
            raise ValueError(
                f"summary_ratio ({self.summary_ratio}) must be below target_context_ratio "
                f"({self.target_context_ratio})"
            )
        return self


class ContextPolicy(WireModel):
    """A named policy: the budget the budgeter and compactor use, and the compaction rules.

    The budget is the model profile's (or a built-in profile's by name), capped by
    ``budget_tokens`` when set. Prepares still check their own request's budget.
    """

    schema_version: SchemaVersion = 1
    name: Identifier
    model_profile: Annotated[str, Field(min_length=1, max_length=200)] | None = "gpt-4o"
    profile: ModelProfile | None = None
    budget_tokens: Annotated[int, Field(gt=0)] | None = None
    compaction: CompactionPolicy = Field(default_factory=CompactionPolicy)
    # How the thread's context runs in windows: summary (one window) or rollover.
    window: WindowPolicy = Field(default_factory=WindowPolicy)

    # ``_one_budget_source`` in the schema. An absent model_profile is "gpt-4o", so a profile needs
    # ``"model_profile": null`` beside it.
    model_config = ConfigDict(
        json_schema_extra=forbidden_shapes(
            {
                "properties": {
                    "model_profile": {"type": "null"},
                    "profile": {"type": "null"},
                    "budget_tokens": {"type": "null"},
                },
                "required": ["model_profile"],
            },
            {
                "properties": {"model_profile": {"type": "string"}, "profile": {"type": "object"}},
                "required": ["profile"],
            },
        )
    )

    @model_validator(mode="after")
    def _one_budget_source(self) -> ContextPolicy:
        if self.model_profile is not None and self.profile is not None:
            raise ValueError("give model_profile or profile, not both")
        if self.model_profile is None and self.profile is None and self.budget_tokens is None:
            raise ValueError("name a model_profile, give a profile, or set budget_tokens")
        return self
