"""PostgreSQL down: every request/reply endpoint answers store_unavailable (typed, retryable),
then recovers."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from contracts import ContextPolicy, OperationStatusRequest, PrepareRequest, ReadRequest, SearchRequest
from infra.embedded import EmbeddedPostgres
from infra.runtime import migrate
from services.edge.client import FleetClient
from services.errors import CtxError, StoreUnavailable
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
