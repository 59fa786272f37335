"""``ctxfleet proxy`` under the official TypeScript SDKs (``openai``, ``@anthropic-ai/sdk``): the script
clients/typescript/test/proxy-conversations.ts, built with ``tsc --strict``, runs a tool-using
conversation per API and mode against the proxy, a scripted upstream and a real fleet."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.fixtures.node import compiled
from tests.fixtures.scripted_upstream import Received
from tests.integration.test_proxy import (
    BUDGET,
    CHAT_TOOLS,
    KEY,
    O200K,
    STEPS,
    SYSTEM,
    Stack,
    _anthropic_fits,
    _anthropic_said,
    _chat_fits,
    _chat_said,
    _ledger,
    _output,
    _step_reply,
    stack,
)

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]
__all__ = ["stack"]  # the fixture, shared with the Python SDKs' test

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "typescript"


@pytest.fixture(scope="session")
def conversations_script() -> Path:
    """The script, compiled by ``tsc --strict`` against the SDKs' own types."""
    return compiled(PACKAGE, "tsconfig.proxy.json") / ".proxy-test" / "proxy-conversations.js"


def _responses_said(items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The ledger a Responses conversation should leave: one assistant message per response."""
    said: list[tuple[Any, ...]] = [("system", SYSTEM)]
    for item in items:
        match item.get("type", "message"), item["role"] if "role" in item else None:
            case "message", "user":
                said.append(("user_input", item["content"]))
            case "message", "assistant":
                said.append(("assistant_message", "".join(p["text"] for p in item["content"]), ()))
            case "function_call", _:
                call = (item["call_id"], item["name"], json.loads(item["arguments"]))
                # The calls of a response belong to the message it opened with.
                if said[-1][0] == "assistant_message":
                    kind, text, calls = said.pop()
                    said.append((kind, text, (*calls, call)))
                else:
                    said.append(("assistant_message", "", (call,)))
            case "function_call_output", _:
                said.append(("tool_outcome", item["call_id"], item["output"]))
            case unknown:
                pytest.fail(f"an item the script does not send: {unknown}")
    return said


def _responses_fits(received: Received) -> None:
    """Within the budget by o200k, and every function_call with its output."""
    body = received.body
    texts = [body["instructions"]]
    for item in body["input"]:
        content = item.get("content")
        texts += [content] if isinstance(content, str) else [p["text"] for p in content or ()]
        texts += [item[k] for k in ("arguments", "output") if k in item]
    assert sum(O200K.count(t) for t in texts) <= BUDGET
    calls = [i["call_id"] for i in body["input"] if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in body["input"] if i.get("type") == "function_call_output"]
    assert sorted(calls) == sorted(outputs)


async def test_typescript_sdks_through_the_proxy_fit_the_budget_and_the_ledger_equals_each_conversation(
    conversations_script: Path, stack: Stack, db: asyncpg.Connection, tmp_path: Path
) -> None:
    conversations = [
        {
            "api": api,
            "stream": stream,
            "thread": f"n-{uuid.uuid4().hex[:10]}",
            "topic": f"Fix the {api} parser.",
        }
        for api in ("chat", "responses", "messages")
        for stream in (False, True)
    ]
    for _ in conversations:
        stack.upstream.script(*(_step_reply(step) for step in range(STEPS + 1)))
    files = {f"src/part{step}.py": _output(step) for step in range(STEPS)}
    assert sum(O200K.count(text) for text in files.values()) > 2 * BUDGET  # the history outgrows the budget
    plan = {
        "key": KEY,
        "system": SYSTEM,
        "model": {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-20250514"},
        "files": files,
        "conversations": conversations,
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan), encoding="utf-8")
    node = await asyncio.create_subprocess_exec(
        "node",
        str(conversations_script),
        stack.proxy_url,
        str(tmp_path / "plan.json"),
        cwd=PACKAGE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), timeout=120)
    assert node.returncode == 0, f"{out.decode()}\n{err.decode()}"
    done = json.loads(out.decode().strip().splitlines()[-1])

    sent = stack.upstream.received
    assert len(sent) == len(conversations) * (STEPS + 1)
    for n, conversation in enumerate(done):
        asked = sent[n * (STEPS + 1) : (n + 1) * (STEPS + 1)]
        said = conversation["said"]
        thread = f"{conversation['thread']}.main"
        match conversation["api"]:
            case "chat":
                assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in asked)
                for received in asked:
                    _chat_fits(received.body)
                    assert received.body["tools"] == CHAT_TOOLS
                assert asked[-1].body["messages"][-1] == said[-2]  # the newest result is always kept
                expected = [_chat_said(m) for m in said]
            case "responses":
                assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in asked)
                for received in asked:
                    _responses_fits(received)
                expected = _responses_said(said)
            case "messages":
                for received in asked:
                    _anthropic_fits(received)
                expected = _anthropic_said(SYSTEM, said)
            case unknown:
                pytest.fail(f"a conversation the plan does not hold: {unknown}")
        assert asked[0].body.get("stream", False) is conversation["stream"]
        assert await _ledger(db, thread, len(expected)) == expected
