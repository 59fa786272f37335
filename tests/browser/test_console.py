"""The console in real headless Chromium, against a real fleet that replayed a bundled sample.

A person's walk: sessions → the session's run → its thread's timeline → the prepared context, then a
search and another thread's state facts. What is checked is what the page shows (text and elements),
and screenshots of it, saved under ``out/console/``.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from playwright.async_api import Browser, Page

from contracts import (
    ContextPolicy,
    PatchOp,
    PathRule,
    PrepareRequest,
    StatePatchEvent,
    StatePatchPayload,
    ToolCatalog,
)
from infra.embedded import free_port
from services.core.trace import read_trace
from ctxfleet_client.client import FleetClient
from services.edge.replay import ReplayOptions, replay_trace
from tests.browser.console_sample import BUDGET, HOSTILE, SAMPLE, SHOTS, VIEWPORT
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


async def _shot(page: Page, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    await page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000, f"{path}: suspiciously small for a rendered page"
    assert _png_size(path) == (VIEWPORT["width"], VIEWPORT["height"])
    return path


async def _quiet(db: asyncpg.Connection, thread_id: str) -> bool:
    """Compacted at least once, and nothing pending: the view will not move under the test."""
    row = await db.fetchrow(
        "SELECT v.view_revision, v.pending_fingerprint, v.evaluated_revision, h.revision "
        "FROM ctx.thread_views v JOIN ctx.thread_heads h USING (thread_id) WHERE thread_id = $1",
        thread_id,
    )
    return (
        row is not None
        and row["view_revision"] > 0
        and row["pending_fingerprint"] is None
        and row["evaluated_revision"] == row["revision"]
    )


async def _count(db: asyncpg.Connection, sql: str, *args: object) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return int(await db.fetchval(sql, *args)) > 0

    return check


async def _state_session(client: FleetClient, run: str) -> Thread:
    """A session whose one fact is set twice: the second value supersedes the first."""
    release = f"shop-{run}@1"
    await client.register_catalog(
        ToolCatalog(release=release, paths=(PathRule(pattern="item:{id}.location", kind="business_fact"),))
    )
    t = Thread()
    await client.append(t.system("shop").model_copy(update={"agent_release": release}))
    for key, where in (("old", "shelf_A"), ("new", "shelf_B")):
        await client.append(
            StatePatchEvent(
                payload=StatePatchPayload(
                    source="orchestrator", ops=(PatchOp(op="set", path="item:42.location", value=where),)
                ),
                event_key=key,
                session_id=t.session_id,
                run_id=t.run_id,
                instance_id="main",
            )
        )
    return t


async def test_console_walks_sessions_to_a_threads_timeline_and_prepared_context_in_chromium(
    start_fleet: Callable[..., Awaitable[Fleet]],
    client: FleetClient,
    db: asyncpg.Connection,
    browser: Browser,
) -> None:
    fleet = await start_fleet(http_port=free_port())
    run = uuid.uuid4().hex[:8]
    session = f"console-{run}"
    policy = ContextPolicy(name=f"console-{run}", model_profile=None, budget_tokens=BUDGET)
    await client.register_policy(policy)
    trace = read_trace(SAMPLE)
    report = await replay_trace(
        client, trace, ReplayOptions(session_id=session, policy=policy.name, budget_tokens=BUDGET)
    )
    assert report.totals["errors"] == 0
    t = Thread(session_id=session, run_id=f"{session}-r1")
    await client.append(t.user(HOSTILE, key=f"hostile-{run}"))
    await client.append_raw(t.thread_id, f"bad-{run}", t.raw(kind="telepathy", payload={"text": "x"}))
    facts = await _state_session(client, run)
    await eventually(
        await _count(db, "SELECT count(*) FROM ctx.dead_letters WHERE thread_id = $1", t.thread_id),
        what="the dead letter",
    )
    await eventually(
        await _count(db, "SELECT count(*) FROM ctx.records WHERE event_key = $1", f"hostile-{run}"),
        what="the hostile record",
    )
    await eventually(lambda: _quiet(db, t.thread_id), timeout=60, what="a compacted, settled view")
    await eventually(
        await _count(db, "SELECT count(*) FROM ctx.search_chunks WHERE session_id = $1", session),
        what="the session indexed",
    )
    await eventually(
        await _count(db, "SELECT count(*) FROM ctx.state_facts WHERE thread_id = $1", facts.thread_id),
        what="the state facts",
    )
    # What the assembler answers a runtime at the policy's budget: the console must draw the same.
    expected = await client.prepare(
        PrepareRequest(session_id=session, run_id=t.run_id, instance_id="main", budget_tokens=BUDGET)
    )
    compaction = await db.fetchrow(
        "SELECT tokens_before, tokens_after FROM ctx.summaries WHERE thread_id = $1 ORDER BY view_revision",
        t.thread_id,
    )

    page = await browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
    base = f"http://127.0.0.1:{fleet.http_port}/console/"
    response = await page.goto(base)
    assert response is not None and response.status == 200
    row = page.locator("#sessions tr.session", has_text=session)
    assert await row.count() == 1
    assert "default" in await row.inner_text()  # the tenant column
    await _shot(page, "sessions")

    await row.get_by_role("link", name=session).click()
    await page.wait_for_selector("h2.run")
    assert t.run_id in await page.locator("h2.run").first.inner_text()
    await page.get_by_role("link", name=t.thread_id).click()
    await page.wait_for_selector("#timeline")

    timeline = await page.locator("#timeline").inner_text()
    first_task = next(line.text for line in trace if line.kind == "user_input")
    assert first_task[:60] in timeline
    assert HOSTILE[:40] in timeline  # shown as the text it is
    assert await page.evaluate("window.__pwned === undefined")
    assert await page.locator("#timeline b, #timeline img, #timeline script").count() == 0
    called = {c.name for line in trace for c in line.tool_calls}
    tools = await page.locator("#timeline .tag.call").all_inner_texts()
    assert tools and {text.split()[0] for text in tools} <= called
    assert "unknown_event_kind" in await page.locator("#dead-letters .dead-code").all_inner_texts()
    assert compaction is not None
    compacted = page.locator("#timeline tr.compaction").first
    assert await compacted.locator(".tokens-before").inner_text() == str(compaction["tokens_before"])
    assert await compacted.locator(".tokens-after").inner_text() == str(compaction["tokens_after"])
    await _shot(page, "timeline")
    await page.locator("#dead-letters").scroll_into_view_if_needed()
    await _shot(page, "timeline-dead-letters")

    await page.locator("#prepare-link").click()
    await page.wait_for_selector("#blocks")
    used = expected.budget_report.used.total
    bars = [
        int(v) for v in await page.locator(".token-bar").evaluate_all("els => els.map(e => e.dataset.tokens)")
    ]
    assert sum(bars) == used
    assert await page.locator("#used-tokens").inner_text() == str(used)
    assert await page.locator("#input-budget").inner_text() == str(expected.budget_report.input_budget)
    assert await page.locator("#blocks tr.block").count() == len(expected.blocks) + 1  # + the overhead row
    reasons = await page.locator("#blocks .reason").all_inner_texts()
    assert [r.strip() for r in reasons[:-1]] == [b.reason for b in expected.blocks]
    assert await page.locator("#gauge-fill").count() == 1
    await _shot(page, "context")

    await page.goto(f"{base}sessions/{session}?tenant=default")
    await page.fill("#search-query", "TimeDelta")
    await page.click("#search-submit")
    await page.wait_for_selector("#hits")
    hits = page.locator("#hits tr.hit")
    assert await hits.count() > 0
    assert "TimeDelta" in await hits.first.locator(".snippet").inner_text()
    await _shot(page, "search")

    await page.goto(f"{base}threads/{facts.thread_id}")
    fact = page.locator("#facts tr.fact", has_text="item:42.location")
    assert await fact.count() == 1
    text = await fact.inner_text()
    assert "shelf_B" in text and "shelf_A" in text and await fact.locator("s").inner_text() == '"shelf_A"'

    await page.goto(f"{base}?tenant=nobody-{run}")
    assert await page.locator("#sessions tr.session").count() == 0
    missing = await page.goto(f"{base}threads/nothing-{run}.main")
    assert missing is not None and missing.status == 404
    assert await page.locator("#error-code").inner_text() == "thread_not_found"
    for path in (f"sessions/nothing-{run}", "sessions/not%20an%20id/search?q=x"):
        missing = await page.goto(f"{base}{path}")
        assert missing is not None and missing.status == 404, path
