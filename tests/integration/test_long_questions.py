"""A first question too long for a prepare's budget is made preparable, not left to fail every prepare:
recorded whole, shown as its head and tail, the rest read back with ``context_read``."""

from __future__ import annotations

import re

import pytest

from contracts import ReadRequest
from services.core.context_tools import CONTEXT_READ
from services.core.tokens import counter_for
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread, prepare_request

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

# A pasted log of numbered lines, over 200k o200k tokens: twice what a gpt-4o prepare may send.
LINES = 14_000
QUESTION = "".join(f"line {i:06d}: the user pasted this part of a long log\n" for i in range(LINES))


async def test_a_200k_token_first_question_is_prepared_at_gpt_4o_within_budget_and_read_back_whole(
    fleet, client: FleetClient
) -> None:
    assert counter_for("o200k_base").count(QUESTION) > 200_000
    t = Thread()
    await client.append(t.system("You read logs."))
    await client.append(t.user(QUESTION, key="q1"))

    prepared = await client.prepare(
        prepare_request(t, after_event_key="q1", wait_ms=30_000, context_tools=True), timeout=60
    )

    report = prepared.budget_report
    assert report.profile == "gpt-4o" and report.used.total <= report.input_budget
    question = prepared.messages[-1].content or ""
    assert question.startswith("line 000000:") and question.endswith(QUESTION.splitlines(keepends=True)[-1])
    assert f"line {LINES // 2:06d}:" not in question  # the middle is left out of the view
    found = re.search(r"ctx://blob/[0-9a-f]{64}", question)
    assert found is not None and f"read it back with {CONTEXT_READ}(ref={found.group(0)})" in question

    middle = await client.read(
        ReadRequest(session_id=t.session_id, ref=found.group(0), line=LINES // 2 + 1, lines=1)
    )
    assert middle.content == f"line {LINES // 2:06d}: the user pasted this part of a long log\n"
    assert middle.sha256_verified and middle.total_bytes == len(QUESTION.encode())

    # The run goes on: the next step is prepared too, with the question still pinned as its task.
    await client.append(t.assistant("The log repeats one line; what should I look for?", key="a1"))
    step = await client.append_and_prepare(t.user("Any line that differs.", key="q2"), prepare_request(t))
    assert step.prepared.budget_report.used.total <= step.prepared.budget_report.input_budget
    contents = [m.content or "" for m in step.prepared.messages]
    assert contents[-1] == "Any line that differs." and any(c.startswith("line 000000:") for c in contents)
