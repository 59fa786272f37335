"""The recorder and the assembler say where a batch's and a prepare's time went, stage by stage, and
the workers export it (a step after an agent's pause can cost twice a back-to-back one, and the
stages tell which round trips and which Python). In memory; the exported series are the registry's."""

from __future__ import annotations

import pytest

from contracts import DeadLetter, PrepareRequest
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.core.ledger import RecordingLimits
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming
from workers.metrics import FleetMetrics

pytestmark = pytest.mark.anyio


class _Sink:
    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        raise AssertionError(letter.code)


class _Stages:
    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    def __call__(self, stage: str, seconds: float) -> None:
        self.seen.append((stage, seconds))

    @property
    def names(self) -> list[str]:
        return [stage for stage, _ in self.seen]


def _recorder(store: MemoryStore, stages: _Stages) -> RecordingService:
    return RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit", on_stage=stages)


async def test_a_recorded_batch_reports_its_read_plan_and_write_in_order() -> None:
    t, stages = Thread(), _Stages()
    result = await _recorder(MemoryStore(), stages).record_batch(
        0, incoming([t.system("Be brief."), t.user("hi")])
    )
    assert result.recorded == 2
    assert stages.names == ["read", "plan", "write"]
    assert all(seconds >= 0 for _, seconds in stages.seen)


async def test_a_batch_recorded_already_reports_only_the_read_that_found_it() -> None:
    store, t = MemoryStore(), Thread()
    batch = incoming([t.system("Be brief."), t.user("hi")])
    await _recorder(store, _Stages()).record_batch(0, batch)
    stages = _Stages()
    result = await _recorder(store, stages).record_batch(0, batch)
    assert (result.recorded, result.skipped) == (0, 2)
    assert stages.names == ["read"]


async def _recorded(store: MemoryStore) -> tuple[Thread, str]:
    t = Thread()
    events = [t.system("Be brief."), t.user("list the files", key="u1")]
    await _recorder(store, _Stages()).record_batch(0, incoming(events))
    return t, "u1"


def _request(t: Thread, **update: object) -> PrepareRequest:
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, model_profile="gpt-4o"
    )
    return request.model_copy(update=update)


async def test_a_prepare_naming_its_event_reports_the_wait_that_read_its_view_and_the_assembly() -> None:
    store = MemoryStore()
    t, key = await _recorded(store)
    stages = _Stages()
    prepared = await PrepareService(store, NoticeBoard(), on_stage=stages).prepare(
        _request(t, after_event_key=key)
    )
    assert prepared.messages[-1].content == "list the files"
    # The statement that found the event read the view with it: no load of its own.
    assert stages.names == ["wait", "assemble"]


async def test_a_prepare_naming_no_event_reports_no_wait() -> None:
    store = MemoryStore()
    t, _ = await _recorded(store)
    stages = _Stages()
    await PrepareService(store, NoticeBoard(), on_stage=stages).prepare(_request(t))
    assert stages.names == ["load", "assemble"]


def test_the_workers_export_each_stage_under_its_own_label() -> None:
    metrics = FleetMetrics()
    record, prepare = metrics.record_stages(), metrics.prepare_stages()
    record("write", 0.003)
    record("write", 0.001)
    prepare("load", 0.002)
    sample = metrics.registry.get_sample_value
    assert sample("ctx_record_stage_seconds_count", {"stage": "write"}) == 2
    total = sample("ctx_record_stage_seconds_sum", {"stage": "write"})
    assert total is not None and abs(total - 0.004) < 1e-9
    assert sample("ctx_record_stage_seconds_count", {"stage": "read"}) == 0
    assert sample("ctx_prepare_stage_seconds_count", {"stage": "load"}) == 1
    assert sample("ctx_prepare_stage_seconds_count", {"stage": "wait"}) == 0
