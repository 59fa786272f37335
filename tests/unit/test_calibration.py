"""Counting per provider family and recovery from a provider's overflow."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from contracts import CompactionJob, PrepareRequest
from contracts.prepare import ProviderOverflow
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.recording import RecordingService
from services.core.assemble import ThreadSnapshot, assemble_context
from services.core.budget import BUILTIN_PROFILES, calibrated, resolve_budget
from services.core.calibration import (
    MAX_FACTOR,
    Calibration,
    learn_from_usage,
    raise_on_overflow,
    request_tokens_before,
    scaled,
)
from services.core.ledger import RecordingLimits
from services.core.tokens import counter_for
from contracts.exceptions import CtxError, InvalidRequest, ProviderContextExceeded, error_from_reply
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming, ledger_records


def test_a_usage_report_above_the_factor_is_taken_at_once() -> None:
    learned = learn_from_usage(Calibration(), provider_input=1_300, local_count=1_000)
    assert learned == Calibration(1.3, 1)


def test_the_factor_never_falls_below_one_however_low_the_provider_counts() -> None:
    current = Calibration()
    for _ in range(20):
        current = learn_from_usage(current, provider_input=500, local_count=1_000)
    assert current == Calibration(1.0, 20)


def test_a_lower_report_only_moves_the_factor_part_of_the_way_down() -> None:
    lower = learn_from_usage(Calibration(1.5, 3), provider_input=1_100, local_count=1_000)
    assert 1.1 < lower.factor < 1.5 and lower.reports == 4
    assert math.isclose(lower.factor, 1.5 + 0.2 * (1.1 - 1.5))


def test_an_absurd_report_is_clamped_and_a_tiny_request_teaches_nothing() -> None:
    assert learn_from_usage(Calibration(), provider_input=50_000, local_count=1_000).factor == MAX_FACTOR
    assert learn_from_usage(Calibration(1.2, 2), provider_input=90, local_count=30) == Calibration(1.2, 2)


def test_an_overflow_raises_the_factor_by_what_the_provider_counted_over_our_estimate() -> None:
    raised = raise_on_overflow(
        Calibration(1.1, 4), our_estimate=190_000, provider_count=228_000, provider_limit=200_000
    )
    assert math.isclose(raised.factor, 1.1 * 1.2) and raised.reports == 5


def test_an_overflow_raises_by_at_least_five_percent_and_uses_the_limit_without_a_count() -> None:
    assert math.isclose(raise_on_overflow(Calibration(), 190_000, 191_000, None).factor, 1.05)
    assert math.isclose(raise_on_overflow(Calibration(), 190_000, None, None).factor, 1.05)
    assert math.isclose(raise_on_overflow(Calibration(), 100_000, None, 200_000).factor, 2.0)


def test_scaled_counts_round_up() -> None:
    assert (scaled(1000, 1.0), scaled(1000, 1.3), scaled(3, 1.01)) == (1000, 1300, 4)


@pytest.mark.parametrize("kind", ["http_413", "payload_too_large", "unknown", ""])
def test_only_an_explicit_context_length_refusal_is_an_overflow(kind: str) -> None:
    with pytest.raises(ValidationError):
        ProviderOverflow.model_validate({"kind": kind, "our_estimate": 10, "view_revision": 0})


def test_anthropic_profiles_are_estimates_and_openai_profiles_stay_exact() -> None:
    assert BUILTIN_PROFILES["claude-sonnet-4"].encoding == "estimate"
    assert BUILTIN_PROFILES["claude-opus-4"].context_window == 200_000
    assert BUILTIN_PROFILES["gpt-4o"].encoding == "o200k_base"


def _snapshot(t: Thread, records: list) -> ThreadSnapshot:  # type: ignore[type-arg]
    return ThreadSnapshot(
        t.session_id, t.run_id, t.instance_id, len(records), records[-1].seq, records[-1].event_key, records
    )


def test_a_calibrated_budget_report_states_method_factor_and_reports() -> None:
    t = Thread()
    records = ledger_records([t.system("s"), t.user("question " * 200)])
    req = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id="main", model_profile="claude-sonnet-4"
    )
    base = resolve_budget(req)
    budget = calibrated(base, Calibration(1.25, 7))
    report = assemble_context(_snapshot(t, records), req, budget, counter_for("o200k_base")).budget_report
    assert report.counting_method == "tiktoken:o200k_base*calibration" and report.estimated
    assert (report.calibration_factor, report.calibration_reports) == (1.25, 7)
    assert report.input_budget == int(base.input_budget / 1.25)
    assert report.estimated_input == scaled(report.used.total, 1.25)
    exact = assemble_context(
        _snapshot(t, records),
        req.model_copy(update={"model_profile": "gpt-4o"}),
        resolve_budget(req.model_copy(update={"model_profile": "gpt-4o"})),
        counter_for("o200k_base"),
    ).budget_report
    assert (exact.counting_method, exact.calibration_factor, exact.estimated) == (
        "tiktoken:o200k_base",
        1.0,
        False,
    )
    assert "calibration_factor" not in exact.model_dump()  # uncalibrated reports are as before


class _Queue:
    def __init__(self) -> None:
        self.jobs: list[CompactionJob] = []

    async def publish(self, job: CompactionJob) -> None:
        self.jobs.append(job)


async def _thread(store: MemoryStore, t: Thread, groups: int = 6) -> None:
    events = [
        t.system("You fix bugs in a Python repository."),
        t.user("Fix the import in app.py", key="task"),
    ]
    for i in range(groups):
        events.append(
            t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": f"cat f{i}.py"}),), key=f"a{i}")
        )
        events.append(t.outcome(f"c{i}", f"contents of f{i}.py " * 60, key=f"out{i}"))
    await RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit").record_batch(
        0, incoming(events)
    )


class _Sink:
    async def publish(self, letter: object, msg_id: str) -> None:
        raise AssertionError(f"nothing here is dead-lettered: {letter}")


def _request(t: Thread, **fields: object) -> PrepareRequest:
    return PrepareRequest.model_validate(
        {"session_id": t.session_id, "run_id": t.run_id, "instance_id": t.instance_id, **fields}
    )


@pytest.mark.anyio
async def test_a_usage_report_calibrates_the_profile_for_this_and_later_prepares() -> None:
    store, t = MemoryStore(), Thread()
    await _thread(store, t)
    service = PrepareService(store, NoticeBoard())
    first = await service.prepare(_request(t, model_profile="claude-sonnet-4"))
    assert first.budget_report.calibration_factor == 1.0
    async with store.connection() as s:
        response = next(
            r.seq for r in await s.select_records(t.thread_id, gt=0, lte=99) if r.event_key == "a5"
        )
    local = request_tokens_before(first, response)
    assert local is not None and local < first.budget_report.used.total
    usage = {"response_event_key": "a5", "input_tokens": round(local * 1.3), "view_revision": 0}
    second = await service.prepare(_request(t, model_profile="claude-sonnet-4", usage=usage))
    assert math.isclose(second.budget_report.calibration_factor, 1.3, abs_tol=0.01)
    assert second.budget_report.calibration_reports == 1
    assert second.budget_report.input_budget < first.budget_report.input_budget
    # Another process (or this one after its cache expires) reads the same stored factor.
    other = await PrepareService(store, NoticeBoard()).prepare(_request(t, model_profile="claude-sonnet-4"))
    assert other.budget_report.calibration_factor == second.budget_report.calibration_factor
    # An exact profile never learns from usage.
    exact = await service.prepare(_request(t, model_profile="gpt-4o", usage=usage))
    assert exact.budget_report.calibration_factor == 1.0


@pytest.mark.anyio
async def test_a_first_overflow_answers_a_smaller_context_and_forces_compaction_a_second_is_refused() -> None:
    store, t, queue = MemoryStore(), Thread(), _Queue()
    await _thread(store, t)
    service = PrepareService(store, NoticeBoard(), queue=queue, compaction_wait_ms=50)
    profile = {"name": "claude-tight", "context_window": 2_100, "encoding": "estimate"}
    before = await service.prepare(_request(t, profile=profile))
    assert before.budget_report.reductions.masked == 0 and not queue.jobs
    overflow = {
        "kind": "context_length_exceeded",
        "provider_limit": 2_100,
        "provider_count": round(before.budget_report.estimated_input * 1.4),
        "our_estimate": before.budget_report.estimated_input,
        "view_revision": before.view_revision,
    }
    after = await service.prepare(_request(t, profile=profile, after_overflow=overflow))
    report = after.budget_report
    assert math.isclose(report.calibration_factor, 1.4, abs_tol=0.01) and report.calibration_reports == 1
    assert report.used.total < before.budget_report.used.total <= before.budget_report.input_budget
    assert report.estimated_input <= 2_100  # as the provider counts it, it fits the window now
    assert queue.jobs and queue.jobs[0].urgent and queue.jobs[0].reasons == ("provider_overflow",)
    with pytest.raises(ProviderContextExceeded) as refused:
        await service.prepare(_request(t, profile=profile, after_overflow=overflow))
    err = refused.value
    assert not err.retryable and err.code == "provider_context_exceeded"
    assert err.details["provider_count"] == overflow["provider_count"]
    assert err.details["our_estimate"] == overflow["our_estimate"]
    assert math.isclose(err.details["calibration_factor"], 1.4, abs_tol=0.01)
    wire = error_from_reply(err.to_reply())
    assert isinstance(wire, ProviderContextExceeded) and isinstance(wire, CtxError)
    # The refusal left the calibration alone: one view, one raise.
    again = await service.prepare(_request(t, profile=profile))
    assert again.budget_report.calibration_factor == report.calibration_factor


@pytest.mark.anyio
async def test_an_overflow_on_a_view_the_thread_has_not_reached_is_an_invalid_request() -> None:
    store, t = MemoryStore(), Thread()
    await _thread(store, t)
    service = PrepareService(store, NoticeBoard())
    overflow = {"kind": "context_length_exceeded", "our_estimate": 2_000, "view_revision": 1}
    with pytest.raises(InvalidRequest):
        await service.prepare(_request(t, model_profile="claude-sonnet-4", after_overflow=overflow))
    # Nothing was learned from it.
    plain = await service.prepare(_request(t, model_profile="claude-sonnet-4"))
    assert plain.budget_report.calibration_factor == 1.0


@pytest.mark.anyio
async def test_the_process_cache_reads_once_per_ttl_and_what_it_learns_is_seen_at_once() -> None:
    from services.app.calibrations import CalibrationCache

    class Reads:
        def __init__(self) -> None:
            self.reads = 0

        async def read_calibration(self, tenant: str, profile: str) -> Calibration:
            self.reads += 1
            return Calibration(1.1, 3)

    now = [0.0]
    cache, reads = CalibrationCache(ttl_s=5.0, clock=lambda: now[0]), Reads()
    assert await cache.get(reads, "acme", "claude-sonnet-4") == Calibration(1.1, 3)
    assert await cache.get(reads, "acme", "claude-sonnet-4") == Calibration(1.1, 3) and reads.reads == 1
    cache.put("acme", "claude-sonnet-4", Calibration(1.4, 4))  # an overflow raised it here
    assert cache.fresh("acme", "claude-sonnet-4") == Calibration(1.4, 4)
    assert cache.fresh("globex", "claude-sonnet-4") is None  # per tenant
    now[0] = 6.0
    assert cache.fresh("acme", "claude-sonnet-4") is None
    assert await cache.get(reads, "acme", "claude-sonnet-4") == Calibration(1.1, 3) and reads.reads == 2
