"""ctx.read: paged, verified read-back of externalized content, only for its own session."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from contracts import PrepareRequest, ReadRequest, SearchRequest
from ctxfleet_client.client import FleetClient
from contracts.exceptions import ContentNotFound, IntegrityError, InvalidRequest
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

LOG = "".join(f"line {i}: ok ✓\n" for i in range(1, 5001))


async def _externalized(client: FleetClient, db: asyncpg.Connection) -> tuple[Thread, str]:
    t = Thread()
    await client.append(t.user("run the build"))
    await client.append(t.assistant(calls=(("c1", "bash", {"cmd": "make"}),)))
    await client.append(t.outcome("c1", LOG, key="out"))
    prepared = await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            budget_tokens=50_000,
            after_event_key="out",
        )
    )
    preview = prepared.messages[-1].content or ""
    start = preview.index("ctx://blob/")
    ref = preview[start : start + len("ctx://blob/") + 64]
    return t, ref


async def test_read_pages_through_the_full_output_that_a_preview_left_out(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, ref = await _externalized(client, db)
    chunks, offset = [], 0
    while offset is not None:
        reply = await client.read(ReadRequest(session_id=t.session_id, ref=ref, offset=offset, length=10_000))
        assert reply.sha256_verified and reply.total_bytes == len(LOG.encode())
        chunks.append(reply.content)
        offset = reply.next_offset  # type: ignore[assignment]
    assert "".join(chunks) == LOG
    lines = await client.read(ReadRequest(session_id=t.session_id, ref=ref, line=2500, lines=2))
    assert (
        lines.content == "line 2500: ok ✓\nline 2501: ok ✓\n"
        and lines.next_line == 2502
        and lines.total_lines == 5000
    )


async def test_read_refuses_another_sessions_content_and_a_tampered_blob(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, ref = await _externalized(client, db)
    with pytest.raises(ContentNotFound):
        await client.read(ReadRequest(session_id="s-someone-else", ref=ref))
    await db.execute(
        "UPDATE ctx.blobs SET content = convert_to('tampered', 'UTF8') WHERE sha256 = $1",
        ref.rsplit("/", 1)[1],
    )
    with pytest.raises(IntegrityError):
        await client.read(ReadRequest(session_id=t.session_id, ref=ref))


async def test_a_value_the_store_refuses_is_answered_in_plain_words_and_the_driver_error_is_logged(
    fleet, client: FleetClient, caplog: pytest.LogCaptureFixture
) -> None:
    # The ref's pattern allows 19 digits, more than a bigint holds: PostgreSQL refuses the value.
    t = Thread()
    await client.append(t.user("x", key="k1"))
    request = ReadRequest(session_id=t.session_id, ref=f"ctx://record/{t.thread_id}/9999999999999999999")
    with caplog.at_level(logging.WARNING, logger="ctxfleet.requests"):
        with pytest.raises(InvalidRequest) as err:
            await client.read(request)
    assert (
        err.value.message
        == "the store refused the request: a value out of range or in a form the store cannot hold"
    )
    assert err.value.details == {"refused": "a value out of range or in a form the store cannot hold"}
    assert "SQLSTATE 22000" in caplog.text and "out of int64 range" in caplog.text


async def test_metrics_endpoint_serves_fleet_metrics_without_thread_labels(
    start_fleet, client: FleetClient
) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await start_fleet(http_port=port)
    t = Thread()
    await client.append(t.user("hello", key="k"))
    await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            budget_tokens=1000,
            after_event_key="k",
        )
    )

    async def scrape() -> str:
        # The endpoint runs on the fleet's own loop: fetch from a thread, as a scraper would from afar.
        page = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
        )
        return bytes(page).decode()

    async def scraped() -> bool:
        return "ctx_events_recorded_total 1.0" in await scrape()

    await eventually(scraped, what="the recorded-events counter")
    await client.search(SearchRequest(session_id=t.session_id, query="hello"))
    body = await scrape()
    for name in (
        "ctx_prepare_seconds_bucket",
        "ctx_prepare_input_tokens_bucket",
        "ctx_compactions_total",
        "ctx_compaction_queue_jobs",
        "ctx_search_seconds_bucket",
        "ctx_indexed_records_total",
    ):
        assert name in body or name.replace("_total", "") in body
    assert t.run_id not in body and t.session_id not in body  # no unbounded label values
    assert 'ctx_prepare_seconds_count{policy="default",purpose="action"} 1.0' in body
    assert 'ctx_searches_total{outcome="ok"} 1.0' in body
