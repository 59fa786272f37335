"""Model profiles and the input budget: ``InputBudget = min(input_limit, C − R − S)``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from contracts import ContextPolicy, ModelProfile, PrepareRequest
from contracts.profiles import BUILTIN_PROFILES

from services.core.calibration import Calibration
from contracts.exceptions import UnknownModelProfile

__all__ = ["BUILTIN_PROFILES", "BudgetSpec", "calibrated", "policy_budget", "resolve_budget"]


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """The budget a prepare works within."""

    profile: str
    context_window: int | None
    input_limit: int | None
    output_reserve: int
    safety_margin: int
    input_budget: int
    encoding: str
    # ``input_budget`` is in local tokens: the profile's budget divided by this factor (as the
    # provider counts it). Only profiles with encoding "estimate" are calibrated from usage.
    calibration_factor: float = 1.0
    calibration_reports: int = 0

    @property
    def learns_from_usage(self) -> bool:
        """Whether usage reports calibrate this profile (no offline tokenizer for it)."""
        return self.encoding == "estimate"


def calibrated(spec: BudgetSpec, calibration: Calibration) -> BudgetSpec:
    """``spec`` with its budget in local tokens under ``calibration``: a local count held against it
    is the provider's count divided by the factor, so the assembly itself needs no change."""
    if calibration.factor <= 1.0 and calibration.reports == 0:
        return spec
    return replace(
        spec,
        input_budget=max(1, int(spec.input_budget / calibration.factor)),
        calibration_factor=calibration.factor,
        calibration_reports=calibration.reports,
    )


def resolve_budget(
    request: PrepareRequest, profiles: Mapping[str, ModelProfile] = BUILTIN_PROFILES
) -> BudgetSpec:
    """The budget of a request: its profile's, capped by ``budget_tokens`` when both are given."""
    profile = request.profile
    if request.model_profile is not None:
        profile = profiles.get(request.model_profile)
        if profile is None:
            raise UnknownModelProfile(request.model_profile, tuple(sorted(profiles)))
    if profile is None:
        assert request.budget_tokens is not None
        return BudgetSpec(
            profile=f"budget:{request.budget_tokens}",
            context_window=None,
            input_limit=request.budget_tokens,
            output_reserve=0,
            safety_margin=0,
            input_budget=request.budget_tokens,
            encoding="o200k_base",
        )
    budget = profile.input_budget
    if request.budget_tokens is not None:
        budget = min(budget, request.budget_tokens)
    return BudgetSpec(
        profile=profile.name,
        context_window=profile.context_window,
        input_limit=profile.input_limit,
        output_reserve=profile.output_reserve,
        safety_margin=profile.safety_margin,
        input_budget=budget,
        encoding=profile.encoding,
    )


def policy_budget(
    policy: ContextPolicy, profiles: Mapping[str, ModelProfile] = BUILTIN_PROFILES
) -> BudgetSpec:
    """The budget the budgeter and compactor use for sessions under ``policy``."""
    request = PrepareRequest(
        session_id="policy",
        run_id="policy",
        instance_id="policy",
        model_profile=policy.model_profile,
        profile=policy.profile,
        budget_tokens=policy.budget_tokens,
    )
    return resolve_budget(request, profiles)
