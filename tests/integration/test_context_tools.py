"""Context tools end to end: a scripted model reads back what its context showed only as head + tail."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from contracts import PrepareRequest, ToolStatus
from services.core.context_tools import CONTEXT_READ, CONTEXT_SEARCH
from ctxfleet_client import ContextTools, FleetClient
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

# 100 kB of numbered lines: every byte range says where it came from.
OUTPUT = "".join(f"row {i:06d}: the build wrote these lines\n" for i in range(2_500))
assert len(OUTPUT.encode()) == 100_000
WORD = "xylophonic"


def _request(t: Thread, key: str) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=50_000,
        after_event_key=key,
        context_tools=True,
    )


def _model_calls(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    """What a Chat Completions model answered: one assistant message with tool calls."""
    tool_calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in calls
    ]
    return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": tool_calls}}]}


async def _built(client: FleetClient, t: Thread) -> str:
    """A thread whose last output is 100 kB; returns the ref its preview names."""
    await client.append(t.system("You fix builds."))
    await client.append(t.user("Why did the build fail?"))
    await client.append(t.assistant(calls=(("c1", "bash", {"cmd": "make"}),)))
    await client.append(t.outcome("c1", OUTPUT, key="out"))
    prepared = await client.prepare(_request(t, "out"))
    assert [f.function.name for f in prepared.tools] == [CONTEXT_READ, CONTEXT_SEARCH]
    preview = prepared.messages[-1].content or ""
    assert preview.startswith("row 000000") and preview.endswith("row 002499: the build wrote these lines\n")
    assert "row 001000" not in preview and len(preview) < 20_000  # head + tail only
    found = re.search(r"ctx://blob/[0-9a-f]{64}", preview)
    assert found is not None and f"read it back with {CONTEXT_READ}(ref={found.group(0)})" in preview
    return found.group(0)


async def test_a_scripted_model_reads_exactly_the_bytes_its_preview_left_out(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    ref = await _built(client, t)
    response = _model_calls(("m1", CONTEXT_READ, {"ref": ref, "offset": 40_000, "length": 1_000}))
    # The runtime records the model's message, then lets the executor answer what it can.
    await client.append(
        t.assistant(calls=(("m1", CONTEXT_READ, {"ref": ref, "offset": 40_000, "length": 1_000}),))
    )
    tools = ContextTools(client, session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id)
    answered = await tools.answer(response)
    assert answered.others == ()
    for event in answered.outcomes:
        await client.append(event)

    (answer,) = answered.answers
    expected = OUTPUT.encode()[40_000:41_000].decode()
    assert answer.reply is not None and answer.reply.content == expected  # type: ignore[union-attr]
    outcome = answered.outcomes[0]
    assert outcome.payload.status is ToolStatus.SUCCESS
    assert outcome.payload.text.split("\n", 1)[1] == expected
    following = await client.prepare(_request(t, outcome.event_key))
    last = following.messages[-1]
    assert last.role == "tool" and last.tool_call_id == "m1" and last.content == outcome.payload.text


async def test_context_search_finds_a_word_of_an_earlier_output(fleet, client: FleetClient) -> None:
    t = Thread()
    await client.append(t.user("Look at the config."))
    await client.append(t.assistant(calls=(("c1", "cat", {"path": "setup.cfg"}),)))
    await client.append(t.outcome("c1", f"[tool]\nmode = {WORD}\n", key="cfg"))
    tools = ContextTools(client, session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id)
    response = _model_calls(("s1", CONTEXT_SEARCH, {"query": WORD, "kind": "tool_outcome"}))

    async def found() -> bool:
        answered = await tools.answer(response)
        return f"ctx://record/{t.thread_id}/3 (tool_outcome" in answered.outcomes[0].payload.text

    await eventually(found, timeout=30, what="the indexer to index the output")
    # The hit is a pointer: reading it back returns the record itself, from the ledger.
    read = await tools.answer(_model_calls(("r1", CONTEXT_READ, {"ref": f"ctx://record/{t.thread_id}/3"})))
    (answer,) = read.answers
    assert answer.refused is None and answer.reply is not None
    assert answer.reply.content == f"[tool]\nmode = {WORD}\n"
    # Another session's record is not there for this one.
    other = Thread()
    elsewhere = ContextTools(
        client, session_id=other.session_id, run_id=other.run_id, instance_id=other.instance_id
    )
    (refused,) = (
        await elsewhere.answer(_model_calls(("r2", CONTEXT_READ, {"ref": f"ctx://record/{t.thread_id}/3"})))
    ).answers
    assert refused.refused == "not_found" and refused.reply is None


async def test_a_read_of_another_sessions_ref_is_refused_not_answered(fleet, client: FleetClient) -> None:
    t, other = Thread(), Thread()
    ref = await _built(client, t)
    tools = ContextTools(
        client, session_id=other.session_id, run_id=other.run_id, instance_id=other.instance_id
    )
    answered = await tools.answer(
        _model_calls(("m1", CONTEXT_READ, {"ref": ref, "offset": 40_000, "length": 1_000}))
    )
    (answer,) = answered.answers
    assert answer.refused == "not_found" and answer.reply is None
    assert answer.outcome.payload.status is ToolStatus.ERROR
    assert "row 0" not in answer.outcome.payload.text and "not_found" in answer.outcome.payload.text


async def test_an_anthropic_tool_use_of_context_read_is_answered_and_shown_as_its_tool_result(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    ref = await _built(client, t)
    prepared = await client.prepare(_request(t, "out").model_copy(update={"format": "anthropic.messages"}))
    body = prepared.request or {}
    tools = body["tools"]
    assert isinstance(tools, list)
    assert [tool["name"] for tool in tools if isinstance(tool, dict)] == [CONTEXT_READ, CONTEXT_SEARCH]
    args = {"ref": ref, "start_line": 1001, "end_line": 1002}
    message = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": CONTEXT_READ, "input": args}],
    }
    await client.append(t.assistant(calls=(("toolu_1", CONTEXT_READ, args),)))
    answered = await ContextTools(
        client, session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id
    ).answer(message)
    (event,) = answered.outcomes
    await client.append(event)
    expected = "row 001000: the build wrote these lines\nrow 001001: the build wrote these lines\n"
    assert event.payload.text.split("\n", 1)[1] == expected
    following = await client.prepare(
        _request(t, event.event_key).model_copy(update={"format": "anthropic.messages"})
    )
    messages = (following.request or {})["messages"]
    assert isinstance(messages, list)
    last = messages[-1]
    assert isinstance(last, dict) and last["role"] == "user"
    (result,) = last["content"]  # type: ignore[misc]
    assert isinstance(result, dict) and result.pop("cache_control") == {"type": "ephemeral"}  # history's end
    assert result == {"type": "tool_result", "tool_use_id": "toolu_1", "content": event.payload.text}
