"""A fleet's /metrics, after it recorded, prepared, compacted and searched, follows the naming rules."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest

from contracts import ContextPolicy, SearchRequest
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread, prepare_request
from tests.fixtures.fleet import eventually
from tests.unit.test_metric_names import exposition_violations

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def test_a_fleet_that_did_its_work_exposes_only_conventional_bounded_metrics(
    start_fleet, client: FleetClient
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    await start_fleet(http_port=port)

    async def scrape() -> str:
        page = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
        )
        return bytes(page).decode()

    # Registered twice: the session pins revision 2, which no label may carry.
    for _ in range(2):
        await client.register_policy(ContextPolicy(name="roomy", model_profile=None, budget_tokens=50_000))
    t = Thread()
    await client.append(t.system("Be brief.").model_copy(update={"policy": "roomy"}))
    for i in range(6):
        await client.append(t.user(f"question {i}: " + "why does the parser drop spaces " * 10))
        await client.append(t.assistant(f"answer {i}: " + "the tokenizer joins adjacent tokens " * 40))
    await client.append(t.user("final question", key="final"))
    full = await client.prepare(prepare_request(t, after_event_key="final"))
    # Half of what the whole history needs: the prepare waits for a compaction to land.
    budget = full.budget_report.used.total // 2
    await client.prepare(
        prepare_request(t, model_profile=None, budget_tokens=budget, after_event_key="final")
    )
    await client.search(SearchRequest(session_id=t.session_id, query="parser"))

    async def compacted() -> bool:
        return "ctx_compaction_after_tokens_count 1.0" in (await scrape()).splitlines()

    await eventually(compacted, what="the committed compaction's sizes on /metrics")
    body = await scrape()
    assert exposition_violations(body) == []
    assert t.run_id not in body and t.session_id not in body
    assert 'ctx_prepare_seconds_count{policy="roomy",purpose="action"} 2.0' in body.splitlines()
    assert any(line.startswith("ctx_prepare_input_tokens_bucket{") for line in body.splitlines())
