"""The idle rule: compact a thread whose provider cache is cold, or about to be, once per idle spell."""

from __future__ import annotations

from services.core.compaction.policy import (
    IDLE_MARGIN_S,
    PROVIDER_CACHE_TTL_S,
    ViewMeasure,
    cache_cold,
)

TTL = PROVIDER_CACHE_TTL_S["openai"]


def _m(reducible: int) -> ViewMeasure:
    return ViewMeasure(
        estimated=9_000, required=2_000, compressible=6_000, budget=16_000, stable=1_500, reducible=reducible
    )


def test_a_thread_idle_past_its_ttl_with_something_reducible_is_compacted() -> None:
    assert cache_cold(_m(4_000), idle_s=TTL + 1, ttl_s=TTL)


def test_a_thread_about_to_go_cold_is_compacted_within_the_margin() -> None:
    assert cache_cold(_m(4_000), idle_s=TTL - IDLE_MARGIN_S, ttl_s=TTL)
    assert not cache_cold(_m(4_000), idle_s=TTL - IDLE_MARGIN_S - 1, ttl_s=TTL)


def test_a_thread_whose_cache_is_warm_is_left_alone() -> None:
    assert not cache_cold(_m(4_000), idle_s=20, ttl_s=TTL)


def test_nothing_reducible_means_no_idle_compaction() -> None:
    assert not cache_cold(_m(0), idle_s=10 * TTL, ttl_s=TTL)


def test_one_idle_compaction_per_idle_spell() -> None:
    assert not cache_cold(_m(4_000), idle_s=10 * TTL, ttl_s=TTL, compacted_while_idle=True)


def test_a_longer_ttl_waits_longer() -> None:
    hour = 3_600.0
    assert not cache_cold(_m(4_000), idle_s=TTL + 1, ttl_s=hour)
    assert cache_cold(_m(4_000), idle_s=hour, ttl_s=hour)


def test_a_margin_wider_than_the_ttl_compacts_at_once() -> None:
    assert cache_cold(_m(4_000), idle_s=0, ttl_s=30, margin_s=60)
