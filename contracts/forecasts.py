"""Forecasts: how much the next steps will need, and whether the window has it.

Seed 004 §29–31: before a model call the runtime knows the window's water level and a forecast of
what the coming steps add; the fleet decides (§35 — the model proposes, the runtime decides). The
forecast rests on the thread's own recent per-step growth plus what the runtime declares it plans
(``PrepareRequest.forecast``); every per-kind estimate it uses is a policy field, so a reply can be
recomputed by hand.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ._base import WireModel

__all__ = ["Forecast", "ForecastDeclaration", "ForecastPolicy"]

_Tokens = Annotated[int, Field(ge=0, le=10_000_000)]


class ForecastPolicy(WireModel):
    """How a forecast is computed; part of ``WindowPolicy``."""

    # The closed steps the growth percentile is taken over (the newest ones).
    recent_steps: Annotated[int, Field(ge=1, le=256)] = 8
    # A high percentile, so one quiet step does not hide a tool that returns a large output.
    percentile: Annotated[int, Field(ge=1, le=100)] = 90
    # Steps a forecast covers when the request does not say (``ForecastDeclaration.expected_steps``).
    expected_steps: Annotated[int, Field(ge=1, le=1_000)] = 3
    # Growth per step assumed while the thread has no closed step of its own yet.
    default_step_tokens: _Tokens = 1_500
    # Per declared item: a tool call and its outcome, a file read into context, a quoted evidence record.
    tool_call_tokens: _Tokens = 800
    file_tokens: _Tokens = 2_000
    evidence_tokens: _Tokens = 600


class ForecastDeclaration(WireModel):
    """What the runtime plans before its next model calls (``PrepareRequest.forecast``); bounded."""

    expected_steps: Annotated[int, Field(ge=1, le=1_000)] | None = None
    tool_calls: Annotated[int, Field(ge=0, le=1_000)] = 0
    files: Annotated[int, Field(ge=0, le=1_000)] = 0
    evidence: Annotated[int, Field(ge=0, le=100)] = 0


class Forecast(WireModel):
    """Tokens the coming steps are expected to add: ``step_growth × steps + declared``."""

    tokens: int
    # The policy percentile of the recent closed steps' growth (the default while there are none).
    step_growth: int
    steps: int
    # How many closed steps of the thread the growth rests on (0: the policy default was used).
    observed_steps: int
    # Tokens for the declared tool calls, files and evidence, at the policy's per-kind estimates.
    declared: int
    # Whether ``tokens`` fits the window's safe remaining tokens (to the red line).
    fits: bool
