"""A process's view of each (tenant, profile)'s calibration, shared by everything that budgets in it.

One indexed row, but read on the hot path: a process re-reads it at most every ``ttl_s``, so what
another replica learned shows here within that time and what this process learns (a usage report,
an overflow) shows at once to its prepares, budgeter and compactor alike.

While the process listens for changes (design D14.22; the calibration triggers), a calibration it *read* stays
current past ``ttl_s`` — for as long as the views it budgets are trusted — until its change is
announced: an agent that thinks longer than ``ttl_s`` between steps then reads neither again. One it
learned itself is written before its own notice comes back, so it keeps only the ``ttl_s`` rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from services.app.view_trust import TrustToken
from services.core.calibration import Calibration

__all__ = ["CalibrationCache", "CalibrationReads", "CalibrationTrust"]


class CalibrationReads(Protocol):
    """What the cache reads through: a store session."""

    async def read_calibration(self, tenant: str, profile: str) -> Calibration: ...


class CalibrationTrust(Protocol):
    """What says a read calibration is still current: the process's ``ViewTrust``."""

    def token(self) -> TrustToken | None: ...
    def calibration_current(self, token: TrustToken, tenant: str, profile: str) -> bool: ...


class CalibrationCache:
    """Calibrations by (tenant, profile), each used for ``ttl_s`` after it was read or learned, and a
    read one for as long as ``trust`` says nothing of it changed."""

    def __init__(
        self,
        *,
        ttl_s: float = 5.0,
        trust: CalibrationTrust | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._trust = trust
        self._clock = clock
        self._entries: dict[tuple[str, str], tuple[float, Calibration, TrustToken | None]] = {}

    def fresh(self, tenant: str, profile: str) -> Calibration | None:
        """The cached calibration, if it is recent enough (or announced unchanged) to use without a read."""
        entry = self._entries.get((tenant, profile))
        if entry is None:
            return None
        at, calibration, token = entry
        if self._clock() - at < self._ttl_s:
            return calibration
        trust = self._trust
        if token is not None and trust is not None and trust.calibration_current(token, tenant, profile):
            return calibration
        return None

    async def get(self, reads: CalibrationReads, tenant: str, profile: str) -> Calibration:
        """The calibration, read through ``reads`` when the cached one is stale."""
        found = self.fresh(tenant, profile)
        if found is None:
            found = await self._read(reads, tenant, profile)
        return found

    async def refresh(self, reads: CalibrationReads, tenant: str, profile: str) -> None:
        """Read the calibration again now, whatever its age (off the hot path, ahead of its expiry)."""
        await self._read(reads, tenant, profile)

    def put(self, tenant: str, profile: str, calibration: Calibration) -> None:
        """What this process just learned (its own change's notice is still to come)."""
        self._entries[(tenant, profile)] = (self._clock(), calibration, None)

    async def _read(self, reads: CalibrationReads, tenant: str, profile: str) -> Calibration:
        # Before the read: a change committed after its snapshot is announced after the token.
        token = self._trust.token() if self._trust is not None else None
        calibration = await reads.read_calibration(tenant, profile)
        self._entries[(tenant, profile)] = (self._clock(), calibration, token)
        return calibration
