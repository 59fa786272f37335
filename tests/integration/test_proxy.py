"""``ctxfleet proxy`` under the official SDKs: a scripted provider upstream, a real fleet in between."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import asyncpg
import httpx2
import openai
import pytest

from ctxfleet_client.client import FleetClient
from services.core.tokens import counter_for
from services.edge.proxy import ProxyConfig, build_app
from tests.fixtures.fleet import eventually
from tests.fixtures.scripted_upstream import Received, Refusal, Said, ScriptedUpstream, serve

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

# Each step's tool output is ~330 o200k tokens: eight steps outgrow this budget about twice over.
BUDGET = 1500
STEPS = 8
SYSTEM = "You fix bugs in a Python repository. Read files before you change them."
KEY = "sk-test-caller-key"
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
ANTHROPIC_TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
O200K = counter_for("o200k_base")


@dataclass
class Stack:
    proxy_url: str
    upstream: ScriptedUpstream
    opened: list[Any] = field(default_factory=list)

    def openai(self, thread: str | None = None) -> openai.AsyncOpenAI:
        headers = {"ctx-thread": thread} if thread else None
        sdk = openai.AsyncOpenAI(
            api_key=KEY, base_url=f"{self.proxy_url}/v1", default_headers=headers, max_retries=0
        )
        self.opened.append(sdk)
        return sdk

    def anthropic(self, thread: str | None = None) -> anthropic.AsyncAnthropic:
        headers = {"ctx-thread": thread} if thread else None
        sdk = anthropic.AsyncAnthropic(
            api_key=KEY, base_url=self.proxy_url, default_headers=headers, max_retries=0
        )
        self.opened.append(sdk)
        return sdk


@pytest.fixture
async def stack(fleet: Any, client: FleetClient) -> AsyncIterator[Stack]:
    upstream = ScriptedUpstream()
    async with serve(upstream.app()) as upstream_url, httpx2.AsyncClient() as http:
        config = ProxyConfig(
            openai_url=f"{upstream_url}/v1", anthropic_url=upstream_url, budget_tokens=BUDGET
        )
        async with serve(build_app(client, http, config)) as proxy_url:
            stack = Stack(proxy_url, upstream)
            yield stack
            for sdk in stack.opened:
                await sdk.close()


def _output(step: int) -> str:
    return "\n".join(
        f"line {n} of src/part{step}.py: value_{n} = compute({n}, step={step})" for n in range(25)
    )


def _step_reply(step: int) -> Said:
    if step == STEPS:
        return Said(text="The parser is fixed.")
    return Said(
        text=f"Reading part {step}.", calls=((f"call_{step}", "read_file", {"path": f"src/part{step}.py"}),)
    )


async def _chat_conversation(
    oa: openai.AsyncOpenAI, upstream: ScriptedUpstream, *, stream: bool, topic: str
) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": topic},
    ]
    for step in range(STEPS + 1):
        upstream.script(_step_reply(step), topic=topic)
        if stream:
            async with oa.chat.completions.stream(model="gpt-4o", messages=messages, tools=CHAT_TOOLS) as s:  # type: ignore[arg-type]
                async for _ in s:
                    pass
                message: Any = (await s.get_final_completion()).choices[0].message
        else:
            completion = await oa.chat.completions.create(model="gpt-4o", messages=messages, tools=CHAT_TOOLS)  # type: ignore[arg-type]
            message = completion.choices[0].message
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls or ()
            if c.type == "function"
        ]
        messages.append(
            {"role": "assistant", "content": message.content, **({"tool_calls": calls} if calls else {})}
        )
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": _output(step)} for c in calls]
    return messages


def _said(kind: str, payload: dict[str, Any]) -> tuple[Any, ...]:
    match kind:
        case "assistant_message":
            calls = tuple((c["call_id"], c["name"], c["args"]) for c in payload["tool_calls"])
            return (kind, payload["text"], calls)
        case "tool_outcome":
            return (kind, payload["call_id"], payload["text"])
        case _:
            return (kind, payload["text"])


def _chat_said(message: dict[str, Any]) -> tuple[Any, ...]:
    match message["role"]:
        case "system":
            return ("system", message["content"])
        case "user":
            return ("user_input", message["content"])
        case "assistant":
            calls = tuple(
                (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                for c in message.get("tool_calls", ())
            )
            return ("assistant_message", message["content"] or "", calls)
        case _:
            return ("tool_outcome", message["tool_call_id"], message["content"])


async def _ledger(db: asyncpg.Connection, thread_id: str, expected: int) -> list[tuple[Any, ...]]:
    # A large text is stored once as a blob, not in the payload.
    query = (
        "SELECT r.kind, r.payload::text AS payload, r.text, convert_from(b.content, 'UTF8') AS blob"
        " FROM ctx.records r LEFT JOIN ctx.blobs b ON b.sha256 = r.blob_sha256"
        " WHERE r.thread_id = $1 ORDER BY r.seq"
    )

    async def complete() -> bool:
        return len(await db.fetch(query, thread_id)) >= expected

    await eventually(complete, what=f"{expected} records of {thread_id}")
    rows = await db.fetch(query, thread_id)
    said = []
    for r in rows:
        payload = json.loads(r["payload"])
        # Text is kept in the record's text column, or its blob, when not in the payload.
        text = next(t for t in (payload.get("text"), r["blob"], r["text"], "") if t is not None)
        said.append(_said(r["kind"], {**payload, "text": text}))
    return said


def _chat_fits(body: dict[str, Any]) -> None:
    """Within the budget by o200k (the gpt-4o family's count), and every call with its result."""
    texts = [m.get("content") or "" for m in body["messages"]]
    texts += [c["function"]["arguments"] for m in body["messages"] for c in m.get("tool_calls", ())]
    assert sum(O200K.count(t) for t in texts) <= BUDGET
    calls = [c["id"] for m in body["messages"] for c in m.get("tool_calls", ())]
    results = [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"]
    assert sorted(calls) == sorted(results)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_proxy_chat_conversation_fits_every_upstream_request_and_the_ledger_equals_it(
    stack: Stack, db: asyncpg.Connection, stream: bool
) -> None:
    thread = f"r-{uuid.uuid4().hex[:10]}"
    messages = await _chat_conversation(
        stack.openai(thread), stack.upstream, stream=stream, topic="Fix the parser."
    )

    sent = stack.upstream.received
    assert len(sent) == STEPS + 1 and all(r.headers["authorization"] == f"Bearer {KEY}" for r in sent)
    unmanaged = sum(O200K.count(m.get("content") or "") for m in messages)
    assert unmanaged > 2 * BUDGET  # the history did outgrow the budget
    for received in sent:
        _chat_fits(received.body)
        assert received.body["tools"] == CHAT_TOOLS and received.body["model"] == "gpt-4o"
    assert sent[-1].body["messages"][-1] == messages[-2]  # the newest result is always kept
    assert await _ledger(db, f"{thread}.main", len(messages)) == [_chat_said(m) for m in messages]


def _anthropic_said(system: str, messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    said: list[tuple[Any, ...]] = [("system", system)]
    for m in messages:
        if isinstance(m["content"], str):
            said.append(("user_input", m["content"]))
        elif m["role"] == "assistant":
            text = "\n".join(b["text"] for b in m["content"] if b["type"] == "text")
            calls = tuple((b["id"], b["name"], b["input"]) for b in m["content"] if b["type"] == "tool_use")
            said.append(("assistant_message", text, calls))
        else:
            said += [("tool_outcome", b["tool_use_id"], b["content"]) for b in m["content"]]
    return said


def _anthropic_fits(received: Received) -> None:
    """The caller's key, within the budget, every tool_use with its result, and a cache breakpoint."""
    body = received.body
    # The caller's own credential, however this SDK version sends it.
    assert KEY in (received.headers.get("x-api-key"), received.headers.get("authorization", "")[7:])
    texts = [b["text"] for b in body["system"]]
    texts += [
        b.get("text") or b.get("content") or json.dumps(b.get("input"))
        for m in body["messages"]
        for b in m["content"]
    ]
    assert sum(O200K.count(t if isinstance(t, str) else json.dumps(t)) for t in texts) <= BUDGET
    use_ids = [b["id"] for m in body["messages"] for b in m["content"] if b["type"] == "tool_use"]
    result_ids = [
        b["tool_use_id"] for m in body["messages"] for b in m["content"] if b["type"] == "tool_result"
    ]
    assert sorted(use_ids) == sorted(result_ids)
    blocks = body["system"] + [b for m in body["messages"] for b in m["content"]]
    assert any("cache_control" in b for b in blocks)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_proxy_anthropic_conversation_keeps_pairs_and_cache_breakpoints_within_the_budget(
    stack: Stack, db: asyncpg.Connection, stream: bool
) -> None:
    thread = f"r-{uuid.uuid4().hex[:10]}"
    ac = stack.anthropic(thread)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the parser."}]
    for step in range(STEPS + 1):
        stack.upstream.script(_step_reply(step))
        params: dict[str, Any] = {
            "model": "claude-sonnet-4-20250514",
            "max_tokens": 1024,
            "system": SYSTEM,
            "messages": messages,
            "tools": ANTHROPIC_TOOLS,
        }
        if stream:
            async with ac.messages.stream(**params) as s:
                reply = await s.get_final_message()
        else:
            reply = await ac.messages.create(**params)
        content = [b.model_dump(include={"type", "text", "id", "name", "input"}) for b in reply.content]
        messages.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        if uses:
            results = [
                {"type": "tool_result", "tool_use_id": b["id"], "content": _output(step)} for b in uses
            ]
            messages.append({"role": "user", "content": results})

    for received in stack.upstream.received:
        _anthropic_fits(received)
    expected = _anthropic_said(SYSTEM, messages)
    assert await _ledger(db, f"{thread}.main", len(expected)) == expected
    # The usage each answer reported came back with the next prepare and calibrated the profile.
    reports = await db.fetchval("SELECT reports FROM ctx.calibrations WHERE profile = 'claude-sonnet-4'")
    assert reports is not None and reports >= 1


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_proxy_responses_conversation_records_calls_and_outputs(
    stack: Stack, db: asyncpg.Connection, stream: bool
) -> None:
    thread = f"r-{uuid.uuid4().hex[:10]}"
    oa = stack.openai(thread)
    items: list[Any] = [{"role": "user", "content": "Fix the parser."}]
    for step in range(3):
        stack.upstream.script(_step_reply(step) if step < 2 else Said(text="Fixed."))
        params: dict[str, Any] = {"model": "gpt-4o", "instructions": SYSTEM, "input": items}
        if stream:
            async with oa.responses.stream(**params) as s:
                response = await s.get_final_response()
        else:
            response = await oa.responses.create(**params)
        output = [o.model_dump(exclude_none=True) for o in response.output]
        items += output
        items += [
            {"type": "function_call_output", "call_id": o["call_id"], "output": f"contents {step}"}
            for o in output
            if o["type"] == "function_call"
        ]

    last = stack.upstream.received[-1].body
    assert last["instructions"] == SYSTEM
    kinds = [i.get("type", "message") for i in last["input"]]
    assert kinds.count("function_call") == kinds.count("function_call_output") == 2
    ledger = await _ledger(db, f"{thread}.main", 7)
    assert [r[0] for r in ledger] == [
        "system",
        "user_input",
        "assistant_message",
        "tool_outcome",
        "assistant_message",
        "tool_outcome",
        "assistant_message",
    ]
    assert ledger[2] == (
        "assistant_message",
        "Reading part 0.",
        (("call_0", "read_file", {"path": "src/part0.py"}),),
    )


async def test_proxy_retried_request_records_nothing_twice(stack: Stack, db: asyncpg.Connection) -> None:
    thread = f"r-{uuid.uuid4().hex[:10]}"
    oa = stack.openai(thread)
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Fix the parser."},
    ]
    stack.upstream.script(Said(text="Looking."), Said(text="Looking."))
    first = await oa.chat.completions.create(model="gpt-4o", messages=messages)
    again = await oa.chat.completions.create(model="gpt-4o", messages=messages)
    assert first.choices[0].message.content == again.choices[0].message.content == "Looking."
    # The retry asks the same question: the answer recorded for the first is not shown to the model.
    assert stack.upstream.received[1].body["messages"] == stack.upstream.received[0].body["messages"]
    messages.append({"role": "assistant", "content": "Looking."})
    messages.append({"role": "user", "content": "Go on."})
    stack.upstream.script(Said(text="Done."))
    await oa.chat.completions.create(model="gpt-4o", messages=messages)

    expected = [_chat_said(m) for m in messages] + [("assistant_message", "Done.", ())]
    assert await _ledger(db, f"{thread}.main", len(expected)) == expected
    letters = await db.fetchval(
        "SELECT count(*) FROM ctx.dead_letters WHERE thread_id = $1", f"{thread}.main"
    )
    assert letters == 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_proxy_passes_provider_errors_through_and_records_no_answer(
    stack: Stack, db: asyncpg.Connection, stream: bool
) -> None:
    thread = f"r-{uuid.uuid4().hex[:10]}"
    limited = {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
    stack.upstream.script(
        Refusal(429, limited, {"retry-after": "7"}),
        Refusal(500, {"error": {"message": "boom", "type": "server_error"}}),
    )
    oa = stack.openai(thread)
    messages: list[Any] = [{"role": "user", "content": "Fix the parser."}]
    with pytest.raises(openai.RateLimitError) as limited_error:
        await oa.chat.completions.create(model="gpt-4o", messages=messages, stream=stream)
    assert limited_error.value.response.headers["retry-after"] == "7"
    assert limited_error.value.body == limited["error"]
    with pytest.raises(openai.InternalServerError):
        await oa.chat.completions.create(model="gpt-4o", messages=messages, stream=stream)

    assert await _ledger(db, f"{thread}.main", 1) == [("user_input", "Fix the parser.")]


async def test_proxy_context_length_refusal_prepares_a_smaller_context_and_retries_once(
    stack: Stack, db: asyncpg.Connection
) -> None:
    thread = f"r-{uuid.uuid4().hex[:10]}"
    too_long = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 1400 tokens > 1000 maximum",
        },
    }
    stack.upstream.script(Refusal(400, too_long), Said(text="Fine."))
    reply = await stack.anthropic(thread).messages.create(
        model="claude-sonnet-4", max_tokens=100, system=SYSTEM, messages=[{"role": "user", "content": "Hi."}]
    )
    assert reply.content[0].type == "text" and reply.content[0].text == "Fine."
    assert len(stack.upstream.received) == 2
    assert await _ledger(db, f"{thread}.main", 3) == [
        ("system", SYSTEM),
        ("user_input", "Hi."),
        ("assistant_message", "Fine.", ()),
    ]

    stack.upstream.script(Refusal(400, too_long), Refusal(400, too_long))
    with pytest.raises(anthropic.BadRequestError) as refused:
        await stack.anthropic(thread).messages.create(
            model="claude-sonnet-4",
            max_tokens=100,
            system=SYSTEM,
            messages=[{"role": "user", "content": "Hi."}],
        )
    assert refused.value.body == too_long  # the second refusal, unchanged


async def test_proxy_concurrent_conversations_find_their_own_threads_from_their_start(
    stack: Stack, db: asyncpg.Connection
) -> None:
    oa = stack.openai()  # no ctx-thread: each conversation's thread comes from its start
    topics = [f"Fix bug {n} ({uuid.uuid4().hex[:8]})." for n in range(4)]
    conversations = await asyncio.gather(
        *(_chat_conversation(oa, stack.upstream, stream=n % 2 == 1, topic=t) for n, t in enumerate(topics))
    )
    for topic, messages in zip(topics, conversations, strict=True):
        threads = await db.fetch("SELECT DISTINCT thread_id FROM ctx.records WHERE text = $1", topic)
        assert len(threads) == 1
        assert await _ledger(db, threads[0]["thread_id"], len(messages)) == [_chat_said(m) for m in messages]
    for received in stack.upstream.received:
        _chat_fits(received.body)


async def test_proxy_refuses_content_it_cannot_record_as_invalid_request(stack: Stack) -> None:
    image: Any = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    with pytest.raises(openai.BadRequestError) as refused:
        await stack.openai().chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": [image]}],
        )
    assert refused.value.response.headers["ctx-error"] == "invalid_request"
    assert stack.upstream.received == []
