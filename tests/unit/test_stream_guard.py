"""The recorder's stream guard over fakes: a halt is sticky until Postgres changes; checks are paced."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from services.core.baseline import Positions
from services.store.tracking import TrackingRepo
from services.store.postgres import PgStore
from workers.metrics import FleetMetrics
from workers.stream_guard import StreamGuard

pytestmark = pytest.mark.anyio

CREATED = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class FakeJetStream:
    def __init__(self, last_seq: int) -> None:
        self.last_seq = last_seq
        self.calls = 0
        self.fail = False

    async def stream_info(self, name: str) -> Any:
        self.calls += 1
        if self.fail:
            raise TimeoutError("nats: timeout")
        return SimpleNamespace(created=CREATED, state=SimpleNamespace(first_seq=1, last_seq=self.last_seq))


class FakePool:
    @asynccontextmanager
    async def _conn(self) -> Any:
        yield SimpleNamespace(transaction=self._transaction)

    @asynccontextmanager
    async def _transaction(self, **_: Any) -> Any:
        yield

    def acquire(self) -> Any:
        return self._conn()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch) -> dict[str, Positions]:
    box = {"positions": Positions({0: 120}, CREATED)}

    async def select_positions(
        conn: Any, consumer: str, stream: str, *, for_update: bool = False
    ) -> Positions:
        return box["positions"]

    monkeypatch.setattr(TrackingRepo, "select_positions", staticmethod(select_positions))
    return box


async def test_stream_guard_halt_is_sticky_until_the_positions_in_postgres_change(
    stored: dict[str, Positions],
) -> None:
    stored["positions"] = Positions(
        {0: 120}, None
    )  # committed before identities: a lost tail is not provable
    js, clock, metrics = FakeJetStream(last_seq=7), Clock(), FleetMetrics()
    guard = StreamGuard(js, PgStore(FakePool()), metrics, every_s=2.0, clock=clock)  # type: ignore[arg-type]
    assert (await guard.check()).kind == "went_backwards"
    assert (
        guard.halt_reason is not None
        and "last seq 7 < committed position 120 of partition 0" in guard.halt_reason
    )
    assert metrics.registry.get_sample_value("ctx_recorder_halted") == 1

    # The stream grows back past the old position: events 8..120 would be skipped, so stay halted.
    js.last_seq = 500
    clock.t = 5.0
    assert (await guard.check()).halted

    stored["positions"] = Positions({0: 0}, CREATED)  # what 'ctxfleet rebaseline --yes' writes
    clock.t = 10.0
    assert (await guard.check()).kind == "intact"
    assert guard.halt_reason is None and metrics.registry.get_sample_value("ctx_recorder_halted") == 0


async def test_stream_guard_checks_at_most_every_interval_and_a_failure_never_counts_as_verified(
    stored: dict[str, Positions],
) -> None:
    stored["positions"] = Positions({0: 5}, CREATED)
    js, clock = FakeJetStream(last_seq=7), Clock()
    guard = StreamGuard(js, PgStore(FakePool()), FleetMetrics(), every_s=2.0, clock=clock)  # type: ignore[arg-type]
    for _ in range(10):
        await guard.check()
    assert js.calls == 1, "cached within the interval: no JetStream call per batch"

    clock.t = 3.0
    js.fail = True
    with pytest.raises(TimeoutError):
        await guard.check(since=2.5)
    assert (await guard.check()).kind == "intact", "the last decision stands until the next attempt is due"
    with pytest.raises(TimeoutError):
        await guard.check(since=2.5)  # a consumer bound after the last success needs a real check
    js.fail = False
    assert (await guard.check(since=2.5)).kind == "intact" and js.calls == 4


async def test_stream_guard_lowers_positions_past_a_lost_tail_and_tells_bound_consumers_to_rebind(
    stored: dict[str, Positions], monkeypatch: pytest.MonkeyPatch
) -> None:
    stored["positions"] = Positions({0: 1206, 1: 50, 2: 1210}, CREATED)
    written: list[tuple[int, int, int]] = []

    async def reset_positions(conn: Any, consumer: str, stream: str, created: datetime, resets: Any) -> bool:
        written.extend((r.partition, r.old, r.new) for r in resets)
        by_partition = dict(stored["positions"].by_partition)
        by_partition.update({r.partition: r.new for r in resets})
        stored["positions"] = Positions(by_partition, created)
        return True

    monkeypatch.setattr(TrackingRepo, "reset_positions", staticmethod(reset_positions))
    metrics = FleetMetrics()
    guard = StreamGuard(FakeJetStream(last_seq=1205), PgStore(FakePool()), metrics, clock=Clock())  # type: ignore[arg-type]
    verdict = await guard.check()
    assert verdict.kind == "intact" and not verdict.halted
    assert written == [(0, 1206, 1205), (2, 1210, 1205)], "only partitions past the end, down to it"
    assert (
        guard.epoch == 1 and metrics.registry.get_sample_value("ctx_recorder_stream_truncations_total") == 1
    )


async def test_stream_guard_reads_positions_before_the_stream_so_a_busy_recorder_is_no_lost_tail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each read of the positions finds the newest event recorded; the stream always holds it by then.
    published = {"last": 1205}

    async def select_positions(
        conn: Any, consumer: str, stream: str, *, for_update: bool = False
    ) -> Positions:
        published["last"] += 1
        return Positions({3: published["last"]}, CREATED)

    class RacingJetStream(FakeJetStream):
        async def stream_info(self, name: str) -> Any:
            self.last_seq = published["last"]
            return await super().stream_info(name)

    monkeypatch.setattr(TrackingRepo, "select_positions", staticmethod(select_positions))
    guard = StreamGuard(RacingJetStream(last_seq=0), PgStore(FakePool()), FleetMetrics(), clock=Clock())  # type: ignore[arg-type]
    assert (await guard.check()).kind == "intact"
    assert guard.epoch == 0
