"""PostgreSQL down: every request/reply endpoint answers store_unavailable (typed, retryable),
then recovers."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import asyncpg
import pytest

from contracts import ContextPolicy, OperationStatusRequest, PrepareRequest, ReadRequest, SearchRequest
from infra.embedded import EmbeddedPostgres
from infra.runtime import migrate
from ctxfleet_client.client import FleetClient
from contracts.exceptions import CtxError, StoreUnavailable
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually, make_settings
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


def _request(t: Thread) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, model_profile="gpt-4o"
    )


async def test_every_endpoint_answers_store_unavailable_while_postgres_is_down_and_serves_again_after(
    own_postgres: EmbeddedPostgres,
    streams: str,
    tmp_path: Path,
    client: FleetClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = own_postgres._server.get_uri()
    await migrate(url)
    fleet = Fleet(
        make_settings(streams, url, tmp_path, workers="recorder,assembler"),
        nats_urls=(streams,),
        database_url=url,
    )
    await fleet.start()
    try:
        t = Thread()
        await client.append(t.user("before the outage", key="k1"))
        await client.prepare(_request(t).model_copy(update={"after_event_key": "k1"}))

        await asyncio.to_thread(own_postgres.stop)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            calls = {
                "prepare": client.prepare(_request(t)),
                "inspect": client.inspect(t.thread_id),
                "session": client.inspect_session(t.session_id),
                "read": client.read(ReadRequest(session_id=t.session_id, ref="ctx://blob/" + "0" * 64)),
                "search": client.search(SearchRequest(session_id=t.session_id, query="outage")),
                "operation": client.operation_status(
                    OperationStatusRequest(session_id=t.session_id, operation_id="op-1")
                ),
                "policy": client.register_policy(ContextPolicy(name="outage-policy")),
            }
            outcomes = dict(
                zip(calls, await asyncio.gather(*calls.values(), return_exceptions=True), strict=True)
            )
            # Repeated failures do not log one line (or one traceback) each.
            for _ in range(20):
                with pytest.raises(StoreUnavailable):
                    await client.prepare(_request(t))

        wrong = {name: repr(o) for name, o in outcomes.items() if not isinstance(o, StoreUnavailable)}
        assert wrong == {}
        assert all(o.retryable and o.message.startswith("store unavailable: ") for o in outcomes.values())  # type: ignore[union-attr]
        request_logs = [r for r in caplog.records if r.name.startswith("ctxfleet.requests")]
        assert [r for r in request_logs if r.exc_info] == []
        assert len(request_logs) <= 1

        await asyncio.to_thread(own_postgres.start)

        async def served() -> bool:
            try:
                prepared = await client.prepare(_request(t))
            except CtxError:
                return False
            return prepared.source_watermark.last_event_key == "k1"

        await eventually(served, timeout=30.0, what="prepares served again after PostgreSQL came back")
    finally:
        await fleet.stop()


async def test_recorder_retries_through_an_outage_saying_so_once_and_records_every_acked_event_once(
    own_postgres: EmbeddedPostgres,
    streams: str,
    tmp_path: Path,
    client: FleetClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = own_postgres._server.get_uri()
    await migrate(url)
    fleet = Fleet(
        make_settings(streams, url, tmp_path, workers="recorder"), nats_urls=(streams,), database_url=url
    )
    caplog.set_level(logging.DEBUG, logger="ctxfleet.recorder")
    await fleet.start()
    try:
        t = Thread()
        await client.append(t.user("before the outage", key="k1"))
        await eventually(lambda: _keys(url, t.thread_id, ["k1"]), what="k1 recorded")

        await asyncio.to_thread(own_postgres.stop)
        caplog.clear()
        # Acked by JetStream while the ledger is down: they must be recorded once it is back.
        for i in range(2, 5):
            await client.append(t.user(f"during the outage {i}", key=f"k{i}"))

        def recorder_said(level: int) -> list[str]:
            return [
                r.getMessage() for r in caplog.records if r.name == "ctxfleet.recorder" and r.levelno >= level
            ]

        async def retried_often() -> bool:
            return len([m for m in recorder_said(logging.DEBUG) if "retrying" in m]) >= 6

        await eventually(retried_often, timeout=60.0, what="the recorder retrying through the outage")
        await asyncio.to_thread(own_postgres.start)
        await eventually(
            lambda: _keys(url, t.thread_id, ["k1", "k2", "k3", "k4"]),
            timeout=30.0,
            what="every event acked during the outage recorded",
        )
    finally:
        await fleet.stop()

    # A failure is said when it starts and when it changes (lost connections, then refused ones, then a
    # server starting up), never at each of its retries or at each idle partition's check.
    warned = [re.sub(r"retrying in [0-9.]+s", "retrying", m) for m in recorder_said(logging.WARNING)]
    assert len(warned) == len(set(warned)), warned
    assert any("working again" in m for m in recorder_said(logging.INFO)), "the recovery is said"
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM ctx.dead_letters") == 0
    finally:
        await conn.close()


async def _keys(url: str, thread_id: str, expected: list[str]) -> bool:
    try:
        conn = await asyncpg.connect(url)
    except (OSError, asyncpg.PostgresError):
        return False
    try:
        rows = await conn.fetch(
            "SELECT event_key FROM ctx.records WHERE thread_id=$1 ORDER BY seq", thread_id
        )
    finally:
        await conn.close()
    return [r["event_key"] for r in rows] == expected
