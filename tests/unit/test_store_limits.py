"""The embedded JetStream store's limit within its disk, and what readiness learns of refused writes."""

from __future__ import annotations

from infra.embedded import fit_store_limit, store_reserve
from workers.refusals import Refusals

MIB = 1 << 20
GIB = 1 << 30


def test_store_reserve_is_a_twentieth_of_the_disk_within_16_mib_and_1_gib() -> None:
    assert store_reserve(60 * MIB) == 16 * MIB
    assert store_reserve(100 * GIB) == 1 * GIB
    assert store_reserve(2 * GIB) == 2 * GIB // 20


def test_fit_store_limit_stays_put_while_the_store_fills_and_rises_when_the_disk_gains_room() -> None:
    configured, reserve = 1 << 40, 16 * MIB
    empty = fit_store_limit(configured, used=0, free=48 * MIB, reserve=reserve)
    assert empty == 32 * MIB
    # The store taking 10 MiB of the disk's room does not move its limit (it would chase the disk).
    assert fit_store_limit(configured, used=10 * MIB, free=38 * MIB, reserve=reserve) == empty
    # The disk grown to 256 MiB: the limit rises with it.
    assert fit_store_limit(configured, used=30 * MIB, free=226 * MIB, reserve=reserve) == 240 * MIB


def test_fit_store_limit_never_exceeds_the_configured_ceiling_nor_drops_below_1_mib() -> None:
    assert fit_store_limit(4 * MIB, used=0, free=100 * GIB, reserve=GIB) == 4 * MIB
    assert fit_store_limit(1 << 40, used=0, free=MIB, reserve=16 * MIB) == MIB


def test_refusals_say_why_until_a_write_succeeds_or_the_refusal_is_stale() -> None:
    now = [0.0]
    refusals = Refusals(fresh_s=30.0, clock=lambda: now[0])
    assert refusals.why("jetstream") is None
    refusals.refused("jetstream", "insufficient resources (503)")
    now[0] = 4.0
    assert refusals.why("jetstream") == "insufficient resources (503) (a write refused 4s ago)"
    assert refusals.why("postgres") is None
    refusals.stored("jetstream")
    assert refusals.why("jetstream") is None
    refusals.refused("postgres", "DiskFullError (SQLSTATE 53100)")
    now[0] = 40.0  # nothing tried since: the refusal says nothing about now
    assert refusals.why("postgres") is None
