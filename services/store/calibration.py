"""Repositories of per-profile calibrations and reported provider overflows. Only SQL here."""

from __future__ import annotations

from collections.abc import Callable

from contracts.prepare import ProviderOverflow

from services.core.calibration import Calibration
from services.store.ledger import Conn

__all__ = ["note_overflow", "read_calibration", "update_calibration"]

_SELECT = "SELECT factor, reports FROM ctx.calibrations WHERE tenant = $1 AND profile = $2"
_ENSURE = """
INSERT INTO ctx.calibrations (tenant, profile) VALUES ($1, $2) ON CONFLICT (tenant, profile) DO NOTHING
"""
_LOCK = "SELECT factor, reports FROM ctx.calibrations WHERE tenant = $1 AND profile = $2 FOR UPDATE"
_UPDATE = """
UPDATE ctx.calibrations SET factor = $3, reports = $4, updated_at = now()
WHERE tenant = $1 AND profile = $2
"""
_NOTE_OVERFLOW = """
INSERT INTO ctx.provider_overflows
    (thread_id, view_revision, profile, provider_limit, provider_count, our_estimate)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (thread_id, view_revision) DO NOTHING
RETURNING 1
"""


async def read_calibration(conn: Conn, tenant: str, profile: str) -> Calibration:
    """The profile's calibration (factor 1.0 on no reports yet)."""
    row = await conn.fetchrow(_SELECT, tenant, profile)
    return Calibration() if row is None else Calibration(float(row["factor"]), int(row["reports"]))


async def update_calibration(
    conn: Conn, tenant: str, profile: str, rule: Callable[[Calibration], Calibration]
) -> Calibration:
    """Apply ``rule`` to the stored calibration under a row lock: concurrent reports never lose one."""
    async with conn.transaction():
        await conn.execute(_ENSURE, tenant, profile)
        row = await conn.fetchrow(_LOCK, tenant, profile)
        assert row is not None
        new = rule(Calibration(float(row["factor"]), int(row["reports"])))
        await conn.execute(_UPDATE, tenant, profile, new.factor, new.reports)
    return new


async def note_overflow(conn: Conn, thread_id: str, profile: str, overflow: ProviderOverflow) -> bool:
    inserted = await conn.fetchval(
        _NOTE_OVERFLOW,
        thread_id,
        overflow.view_revision,
        profile,
        overflow.provider_limit,
        overflow.provider_count,
        overflow.our_estimate,
    )
    return inserted is not None
