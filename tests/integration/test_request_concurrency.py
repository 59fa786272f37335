"""Request/reply under load: no head-of-line blocking, a typed answer to overload, no late answers."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest

from contracts import PreparedContext, PrepareRequest
from contracts.subjects import prepare_subject
from ctxfleet_client.client import DEADLINE_HEADER, FleetClient
from contracts.exceptions import ContentNotFound, NotYetRecorded, Overloaded
from tests.fixtures.builders import Thread, prepare_request as _request
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


def _sample(fleet, name: str, **labels: str) -> float:
    return fleet.metrics.registry.get_sample_value(name, labels) or 0.0


async def _timed_prepare(client: FleetClient, request: PrepareRequest) -> float:
    started = time.monotonic()
    await client.prepare(request)
    return time.monotonic() - started


async def test_unrelated_prepare_is_answered_in_its_normal_time_while_ten_prepares_wait_for_their_events(
    start_fleet, client: FleetClient
) -> None:
    # Fewer slots (4) than waiters (10): if a wait held its slot, the unrelated prepare could not run.
    fleet = await start_fleet(workers="recorder,assembler", max_inflight_requests=4)
    t = Thread()
    await client.append(t.user("hello", key="k1"))
    await client.prepare(_request(t, after_event_key="k1"))
    alone = min([await _timed_prepare(client, _request(t)) for _ in range(3)])

    waiters = [
        asyncio.create_task(client.prepare(_request(Thread(), after_event_key="lost", wait_ms=5_000)))
        for _ in range(10)
    ]

    async def all_waiting() -> bool:
        return _sample(fleet, "ctx_waiting_requests") == 10

    await eventually(all_waiting, what="ten prepares waiting for their events")
    behind = await _timed_prepare(client, _request(t))

    assert behind < 1.0, f"unrelated prepare took {behind:.3f}s behind ten waiters (alone {alone:.3f}s)"
    assert not any(w.done() for w in waiters)
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(r, NotYetRecorded) for r in results), results


async def test_prepares_beyond_the_limit_are_answered_overloaded_with_a_retry_hint_and_the_rest_are_served(
    start_fleet, client: FleetClient
) -> None:
    # Two slots and a 50 ms queue age: a burst of 100, each reading the ledger, cannot all be served
    # in time.
    fleet = await start_fleet(workers="recorder,assembler", max_inflight_requests=2, max_queue_age_ms=50)
    t = Thread()
    for i in range(30):
        await client.append(t.user(f"question {i} " + "words " * 50, key=f"q{i}"))
    expected = await client.prepare(_request(t, after_event_key="q29"))

    results = await asyncio.gather(*(client.prepare(_request(t)) for _ in range(100)), return_exceptions=True)

    overloaded = [r for r in results if isinstance(r, Overloaded)]
    served = [r for r in results if isinstance(r, PreparedContext)]
    assert len(overloaded) + len(served) == 100, [
        r for r in results if not isinstance(r, Overloaded | PreparedContext)
    ]
    assert overloaded and served
    assert all(o.retryable and o.retry_after_ms >= 50 and o.details["limit"] == 2 for o in overloaded)
    assert all(s == expected for s in served)
    rejected = _sample(fleet, "ctx_requests_rejected_total", reason="queue_full") + _sample(
        fleet, "ctx_requests_rejected_total", reason="queue_age"
    )
    assert rejected == len(overloaded)


async def test_request_whose_deadline_passed_is_dropped_unanswered_and_counted(fleet, streams: str) -> None:
    t = Thread()  # never recorded: a processed prepare would answer thread_not_found
    subject, body = prepare_subject("default", t.thread_id), _request(t).model_dump_json().encode()
    nc = await nats.connect(streams)
    try:
        past = str(int(time.time() * 1000) - 1_000)
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request(subject, body, timeout=1.0, headers={DEADLINE_HEADER: past})
        assert _sample(fleet, "ctx_requests_rejected_total", reason="deadline") == 1
        assert _sample(fleet, "ctx_prepare_errors_total", code="thread_not_found") == 0

        # Without the header (another language's client), the same request is served.
        reply = await nc.request(subject, body, timeout=5.0)
        assert json.loads(reply.data)["code"] == "thread_not_found"
        assert _sample(fleet, "ctx_prepare_errors_total", code="thread_not_found") == 1
        assert _sample(fleet, "ctx_requests_rejected_total", reason="deadline") == 1
    finally:
        await nc.close()


async def test_client_sends_its_deadline_with_every_request(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    seen: list[dict[str, str]] = []

    async def answer(msg) -> None:  # type: ignore[no-untyped-def]
        seen.append(dict(msg.headers or {}))
        await msg.respond(b'{"type": "error", "code": "not_found", "message": "nothing here"}')

    await nc.subscribe(prepare_subject("default", "r-deadline.main"), cb=answer)
    client = await FleetClient.connect(nats_url)
    try:
        before = time.time() * 1000
        with pytest.raises(ContentNotFound, match="nothing here"):
            await client.prepare(_request(Thread(run_id="r-deadline")), timeout=3.0)
        after = time.time() * 1000
    finally:
        await client.close()
        await nc.close()
    deadline = int(seen[0][DEADLINE_HEADER])
    assert before + 3_000 <= deadline + 1 and deadline <= after + 3_000


async def test_unrelated_prepare_is_served_while_another_waits_for_its_compaction(
    start_fleet, client: FleetClient
) -> None:
    # One slot, no compactor: the over-budget prepare waits its whole compaction_wait_ms holding no slot.
    fleet = await start_fleet(workers="recorder,assembler", max_inflight_requests=1, compaction_wait_ms=3_000)
    long, short = Thread(), Thread()
    for i in range(20):
        await client.append(
            long.user(f"message {i}: " + "history that must be summarized, never dropped " * 8, key=f"m{i}")
        )
    await client.append(short.user("hello", key="h"))
    await client.prepare(_request(short, after_event_key="h"))
    await client.prepare(_request(long, after_event_key="m19", budget_tokens=100_000))

    # 600 tokens: the required messages fit, the history does not; no compactor runs, so after its
    # wait the prepare is served without the oldest history, each omission named.
    waiting = asyncio.create_task(client.prepare(_request(long, budget_tokens=600)))

    async def compaction_waiting() -> bool:
        return _sample(fleet, "ctx_waiting_requests") == 1

    await eventually(compaction_waiting, what="the over-budget prepare waiting for its compaction")
    behind = await _timed_prepare(client, _request(short))

    assert behind < 1.0, f"unrelated prepare took {behind:.3f}s behind a compaction wait"
    assert not waiting.done()
    served = await waiting
    assert served.compaction_wait_ms >= 2_900 and served.budget_report.used.total <= 600
    assert served.budget_report.reductions.dropped_history > 0
    assert all("history awaiting compaction" in o.reason for o in served.omitted)
