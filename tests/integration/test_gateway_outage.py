"""PostgreSQL killed while prepares are answered: every context answered ``ok`` is recorded for its
gateway check once PostgreSQL is back — real NATS, a PostgreSQL of this test alone, SIGKILLed."""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from pathlib import Path

import asyncpg
import pytest

import workers.compose

from contracts import PreparedContext, PrepareRequest
from infra.embedded import EmbeddedPostgres
from infra.runtime import migrate
from services.app.final_checks import GatewayService
from ctxfleet_client.client import FleetClient
from contracts.exceptions import CtxError
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually, make_settings
from tests.fixtures.servers import kill_postgres
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

_THREADS = 4


def _request(t: Thread, budget: int, **fields: object) -> PrepareRequest:
    # A budget of its own per prepare: each answer is a context of its own, with its own id.
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        model_profile="gpt-4o",
        budget_tokens=budget,
        format="openai.responses",  # a reply with the request to send, for the check
        **fields,  # type: ignore[arg-type]
    )


async def test_every_context_answered_ok_is_recorded_after_postgres_is_killed_mid_flush(
    own_postgres: EmbeddedPostgres,
    streams: str,
    tmp_path: Path,
    client: FleetClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = own_postgres._server.get_uri()
    await migrate(url)
    # Nothing cached: every check reads the stored record, as on another replica.
    monkeypatch.setattr(workers.compose, "GatewayService", partial(GatewayService, cache_contexts=0))
    settings = make_settings(streams, url, tmp_path, workers="recorder,assembler")
    fleet = Fleet(settings, nats_urls=(streams,), database_url=url)
    await fleet.start()
    answered: list[PreparedContext] = []
    stop = asyncio.Event()
    loops: list[asyncio.Task[None]] = []
    try:
        gateway = fleet.gateway
        assert gateway is not None
        threads = [Thread() for _ in range(_THREADS)]
        for n, t in enumerate(threads):
            await client.append(t.user(f"question {n} before the outage", key=f"k{n}"))
            answered.append(await client.prepare(_request(t, 4000, after_event_key=f"k{n}")))

        async def prepare_in_a_loop(t: Thread, first_budget: int) -> None:
            budget = first_budget
            while not stop.is_set():
                budget += _THREADS
                try:
                    answered.append(await client.prepare(_request(t, budget), timeout=10.0))
                except CtxError:
                    await asyncio.sleep(0.02)  # store_unavailable while PostgreSQL is down

        # A prepare waiting for an event that never comes is in progress all along: the write-behind
        # yields to it before each record, so records are pending when PostgreSQL is killed.
        holder = asyncio.create_task(
            client.prepare(_request(threads[0], 3000, after_event_key="never", wait_ms=4000))
        )
        loops = [asyncio.create_task(prepare_in_a_loop(t, 5000 + n)) for n, t in enumerate(threads)]

        async def pending() -> bool:
            return len(answered) >= 40 and gateway.pending_records >= 5

        await eventually(pending, timeout=30.0, what="prepares answered with their records still pending")

        await asyncio.to_thread(kill_postgres, own_postgres)
        with contextlib.suppress(CtxError):
            await holder

        async def retrying() -> bool:
            return gateway.retried_records > 0

        await eventually(retrying, timeout=30.0, what="the write-behind retrying through the outage")
        assert not gateway.dropped_records
        await asyncio.to_thread(own_postgres.restart)
        before = len(answered)

        async def serving_again() -> bool:
            return len(answered) >= before + 20

        await eventually(serving_again, timeout=60.0, what="prepares answered after PostgreSQL came back")
        stop.set()
        await asyncio.gather(*loops)

        async def all_stored() -> bool:
            return gateway.pending_records == 0

        await eventually(all_stored, timeout=60.0, what="every pending record stored")

        ids = {(p.prepared_id, p.format) for p in answered}
        conn = await asyncpg.connect(url)
        try:
            stored = {(r["prepared_id"], r["format"]) for r in await conn.fetch(_STORED)}
        finally:
            await conn.close()
        assert sorted(ids - stored) == []
        assert not gateway.dropped_records
        # And the check finds them: the first answered (before the outage) and the last ones.
        for prepared in [answered[0], *answered[-3:]]:
            assert prepared.request is not None
            assert (await client.check_final(prepared, prepared.request)).outcome == "ok"
    finally:
        stop.set()
        await asyncio.gather(*loops, return_exceptions=True)
        await fleet.stop()


_STORED = "SELECT prepared_id, format FROM ctx.prepared_contexts"
