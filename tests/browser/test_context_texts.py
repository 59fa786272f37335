"""A block's text on the console's context page, in real headless Chromium: collapsed until a
person expands it, then the text the model reads, a long one cut with its full length stated."""

from __future__ import annotations

from collections.abc import Callable, Awaitable

import pytest
from playwright.async_api import Browser

from contracts import PrepareRequest
from infra.embedded import free_port
from ctxfleet_client import FleetClient
from tests.fixtures.builders import Thread
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

SYSTEM = "You fix bugs in a Python repository. Never edit the tests."
# Longer than the page shows of one block: the rest is cut, and the page says how much.
LONG_OUTPUT = "".join(f"line {i} of a very long build log\n" for i in range(400))


async def test_a_person_expands_a_block_on_the_context_page_and_reads_its_text(
    start_fleet: Callable[..., Awaitable[Fleet]], client: FleetClient, browser: Browser
) -> None:
    fleet = await start_fleet(http_port=free_port())
    t = Thread()
    await client.append(t.system(SYSTEM))
    await client.append(t.user("Why does the build fail?", key="task"))
    await client.append(t.assistant("Reading the log.", calls=(("c1", "bash", {"cmd": "make"}),)))
    await client.append(t.outcome("c1", LONG_OUTPUT, key="log"))
    await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            model_profile="gpt-4o",
            after_event_key="log",
        )
    )

    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    url = f"http://127.0.0.1:{fleet.http_port}/console/threads/{t.thread_id}/context"
    response = await page.goto(url)
    assert response is not None and response.status == 200
    instruction = page.locator("#blocks tr.block-text details").first
    text = instruction.locator("pre.text")
    assert not await text.is_visible()  # collapsed until asked for

    await instruction.locator("summary").click()

    assert await text.is_visible()
    assert "[system]" in await text.inner_text() and SYSTEM in await text.inner_text()
    log = page.locator("#blocks tr.block-text details", has_text="more characters")
    assert await log.count() == 1
    await log.locator("summary").click()
    summary = await log.locator("summary").inner_text()
    assert "first 4000 shown" in summary
    shown = await log.locator("pre.text").inner_text()
    assert "line 0 of a very long build log" in shown and "line 399 of" not in shown
    assert "budget from the session's policy default@" in await page.locator("#budget-source").inner_text()
