"""What the fleet served a thread, in real headless Chromium: the chart, a step's diff, a compaction.

A fleet replays a bundled sample at a budget small enough to compact; a person then opens the
thread's served contexts and must see a chart of every step against the budget with the compaction
marked, the step after it with what left and what replaced it, and the compaction's before and
after with the summary's text. Screenshots go to ``out/console/`` (``make screenshots`` copies them
to docs/screenshots/).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
from playwright.async_api import Browser, Page

from contracts import ContextPolicy, PrepareRequest
from infra.embedded import free_port
from services.core.trace import read_trace
from ctxfleet_client import FleetClient
from services.edge.replay import ReplayOptions, replay_trace
from tests.browser.console_sample import BUDGET, HOSTILE, SAMPLE, SHOTS, VIEWPORT
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


async def _shot(page: Page, name: str) -> None:
    path = SHOTS / f"{name}.png"
    # Playwright creates the folder; a full page, so a screenshot shows the whole page in docs/.
    png = await page.screenshot(path=str(path), full_page=True)
    assert len(png) > 10_000, f"{path}: suspiciously small for a rendered page"


async def _count(db: asyncpg.Connection, sql: str, *args: object) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return int(await db.fetchval(sql, *args)) > 0

    return check


async def _served_across_a_compaction(db: asyncpg.Connection, thread_id: str) -> bool:
    """A compaction committed, and contexts served both before and after it were recorded."""
    views = await db.fetch(
        "SELECT (manifest->>'view_revision')::int AS v FROM ctx.served_contexts WHERE thread_id = $1",
        thread_id,
    )
    revisions = {r["v"] for r in views}
    return 0 in revisions and any(v > 0 for v in revisions)


async def test_served_pages_show_the_chart_a_steps_diff_and_a_compactions_before_and_after(
    start_fleet: Callable[..., Awaitable[Fleet]],
    client: FleetClient,
    db: asyncpg.Connection,
    browser: Browser,
) -> None:
    fleet = await start_fleet(http_port=free_port())
    run = uuid.uuid4().hex[:8]
    session = f"served-{run}"
    policy = ContextPolicy(name=f"served-{run}", model_profile=None, budget_tokens=BUDGET)
    await client.register_policy(policy)
    report = await replay_trace(
        client,
        read_trace(SAMPLE),
        ReplayOptions(session_id=session, policy=policy.name, budget_tokens=BUDGET),
    )
    assert report.totals["errors"] == 0
    t = Thread(session_id=session, run_id=f"{session}-r1")
    # The compaction may land after the replay's last prepare: one more step is then served after it.
    await eventually(
        await _count(db, "SELECT count(*) FROM ctx.summaries WHERE thread_id = $1", t.thread_id),
        timeout=60,
        what="a compaction committed",
    )
    await client.append(t.user(HOSTILE, key=f"hostile-{run}"))
    last = await client.prepare(
        PrepareRequest(
            session_id=session,
            run_id=t.run_id,
            instance_id="main",
            budget_tokens=BUDGET,
            after_event_key=f"hostile-{run}",
        )
    )
    await eventually(
        await _count(db, "SELECT count(*) FROM ctx.served_contexts WHERE prepared_id = $1", last.prepared_id),
        what="the last step recorded",
    )
    await eventually(
        lambda: _served_across_a_compaction(db, t.thread_id),
        timeout=60,
        what="served contexts around a compaction",
    )
    steps = await db.fetch(
        "SELECT step, manifest::text AS m FROM ctx.served_contexts WHERE thread_id = $1 ORDER BY step",
        t.thread_id,
    )
    manifests = [json.loads(r["m"]) for r in steps]
    after = next(n for n, m in enumerate(manifests) if m["view_revision"] > 0)
    revision = manifests[after]["view_revision"]
    summary = await db.fetchrow(
        "SELECT text, tokens_before, tokens_after FROM ctx.summaries "
        "WHERE thread_id = $1 AND view_revision = $2",
        t.thread_id,
        revision,
    )
    assert summary is not None

    page = await browser.new_page(viewport=VIEWPORT)  # type: ignore[arg-type]
    base = f"http://127.0.0.1:{fleet.http_port}/console/"
    await page.goto(f"{base}threads/{t.thread_id}")
    await page.locator("#served-link").click()
    await page.wait_for_selector("#timeline-chart")

    # The chart: one stacked bar per step, against the budget, with the compaction marked.
    drawn = await page.locator("#timeline-chart rect.seg").evaluate_all(
        "els => els.map(e => "
        "[Number(e.dataset.step), Number(e.dataset.tokens), e.getBoundingClientRect().height])"
    )
    assert {step for step, _, _ in drawn} == {r["step"] for r in steps}
    per_step: dict[int, int] = {}
    for step, tokens, _ in drawn:
        per_step[step] = per_step.get(step, 0) + tokens
    assert per_step == {r["step"]: m["used"]["total"] for r, m in zip(steps, manifests, strict=True)}
    assert max(height for _, _, height in drawn) > 40  # a person sees bars, not hairlines
    budget = page.locator('#timeline-chart g.line[data-name="budget"]')
    assert await budget.get_attribute("data-tokens") == str(manifests[-1]["input_budget"])
    assert await budget.is_visible()
    assert await page.locator("#timeline-chart g.mark.compaction").count() >= 1
    assert await page.locator("#served tr.step").count() == len(steps)
    await _shot(page, "served")

    # The first step after the compaction: what left the window, the summary that came in, and why.
    await page.locator(f"#step-{steps[after]['step']} a").click()
    await page.wait_for_selector("#diff")
    removed = page.locator("#diff tr.change.removed")
    left_blocks = await removed.count()
    assert left_blocks > 0
    assert set(await removed.locator(".tag.reason").all_inner_texts()) == {"compaction"}
    added_summary = page.locator("#diff tr.change.added", has_text="summary")
    assert await added_summary.count() >= 1
    seen = page.locator("#seen li.seen-block")
    assert await seen.count() == len(manifests[after]["blocks"])
    summary_block = page.locator("#seen li.seen-block.new", has_text="summary").first
    assert await summary_block.locator("pre.text").is_visible()  # new blocks are open
    assert summary["text"][:60] in await summary_block.locator("pre.text").inner_text()
    first = page.locator("#seen li.seen-block").first
    assert not await first.locator("pre.text").is_visible()  # kept blocks are collapsed …
    await first.locator("summary").click()
    assert await first.locator("pre.text").is_visible()  # … and open on a click
    await _shot(page, "served-step")

    # The compaction: before and after, the summary's text, what left and how to read it back.
    await page.goto(f"{base}threads/{t.thread_id}/compactions/{revision}")
    assert await page.locator(".tokens-before").inner_text() == str(summary["tokens_before"])
    assert await page.locator(".tokens-after").inner_text() == str(summary["tokens_after"])
    before_row, after_row = page.locator("#before-after tr.before"), page.locator("#before-after tr.after")
    assert await before_row.locator(".served-tokens").inner_text() == str(
        manifests[after - 1]["used"]["total"]
    )
    assert await after_row.locator(".served-tokens").inner_text() == str(manifests[after]["used"]["total"])
    assert await page.locator("#summary-text").inner_text() == summary["text"]
    left = page.locator("#left tr.left-block")
    assert await left.count() == left_blocks
    assert f"ctx://record/{t.thread_id}/" in await left.first.inner_text()
    await _shot(page, "compaction")

    # The last step shows the hostile input as the text it is.
    await page.goto(f"{base}threads/{t.thread_id}/served/{steps[-1]['step']}")
    shown = await page.locator("#seen pre.text").all_inner_texts()
    assert any(HOSTILE in text for text in shown)
    assert await page.evaluate("window.__pwned === undefined")
    assert (
        await page.locator("#seen b, #seen img, #seen script, #diff b, #diff img, #diff script").count() == 0
    )

    # Another tenant sees none of it.
    other = await page.goto(f"{base}threads/{t.thread_id}/served?tenant=nobody-{run}")
    assert other is not None and other.status == 404
