"""The recorder's stream guard over fakes: a halt is sticky until Postgres changes; checks are paced."""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

from services.baseline import Positions
from services.store.ledger import TrackingRepo
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

    async def select_positions(conn: Any, consumer: str, stream: str, *, for_update: bool = False) -> Positions:
        return box["positions"]

    monkeypatch.setattr(TrackingRepo, "select_positions", staticmethod(select_positions))
    return box


async def test_stream_guard_halt_is_sticky_until_the_positions_in_postgres_change(stored: dict[str, Positions]) -> None:
    js, clock, metrics = FakeJetStream(last_seq=7), Clock(), FleetMetrics()
    guard = StreamGuard(js, FakePool(), metrics, every_s=2.0, clock=clock)  # type: ignore[arg-type]
    assert (await guard.check()).kind == "went_backwards"
    assert guard.halt_reason is not None and "last seq 7 < committed position 120 of partition 0" in guard.halt_reason
    assert metrics.recorder_halted._value.get() == 1

    # The stream grows back past the old position: events 8..120 would be skipped, so stay halted.
    js.last_seq = 500
    clock.t = 5.0
    assert (await guard.check()).halted

    stored["positions"] = Positions({0: 0}, CREATED)  # what 'ctxfleet rebaseline --yes' writes
    clock.t = 10.0
    assert (await guard.check()).kind == "intact"
    assert guard.halt_reason is None and metrics.recorder_halted._value.get() == 0


async def test_stream_guard_checks_at_most_every_interval_and_a_failure_never_counts_as_verified(
    stored: dict[str, Positions],
) -> None:
    stored["positions"] = Positions({0: 5}, CREATED)
    js, clock = FakeJetStream(last_seq=7), Clock()
    guard = StreamGuard(js, FakePool(), FleetMetrics(), every_s=2.0, clock=clock)  # type: ignore[arg-type]
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
