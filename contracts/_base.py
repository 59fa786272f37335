"""The base every wire model shares: frozen, closed, versioned."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["WireModel"]


class WireModel(BaseModel):
    """A frozen model that rejects unknown fields, so a typo is an error and not a silent default."""

    model_config = ConfigDict(frozen=True, extra="forbid")
