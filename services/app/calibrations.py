"""A process's view of each (tenant, profile)'s calibration, shared by everything that budgets in it.

One indexed row, but read on the hot path: a process re-reads it at most every ``ttl_s``, so what
another replica learned shows here within that time and what this process learns (a usage report,
an overflow) shows at once to its prepares, budgeter and compactor alike. A calibration scales a
budget; it is not part of the ledger a view is read from (``services/app/freshness.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from services.core.calibration import Calibration

__all__ = ["CalibrationCache", "CalibrationReads"]


class CalibrationReads(Protocol):
    """What the cache reads through: a store session."""

    async def read_calibration(self, tenant: str, profile: str) -> Calibration: ...


class CalibrationCache:
    """Calibrations by (tenant, profile), each used for ``ttl_s`` after it was read or learned."""

    def __init__(self, *, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[tuple[str, str], tuple[float, Calibration]] = {}

    def fresh(self, tenant: str, profile: str) -> Calibration | None:
        """The cached calibration, if it is recent enough to use without a read."""
        entry = self._entries.get((tenant, profile))
        if entry is None:
            return None
        at, calibration = entry
        return calibration if self._clock() - at < self._ttl_s else None

    async def get(self, reads: CalibrationReads, tenant: str, profile: str) -> Calibration:
        """The calibration, read through ``reads`` when the cached one is stale."""
        found = self.fresh(tenant, profile)
        if found is None:
            found = await reads.read_calibration(tenant, profile)
            self.put(tenant, profile, found)
        return found

    def put(self, tenant: str, profile: str, calibration: Calibration) -> None:
        """What this process just learned."""
        self._entries[(tenant, profile)] = (self._clock(), calibration)
