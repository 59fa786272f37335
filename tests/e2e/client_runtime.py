"""A runtime built on the installed client distribution alone: it replays a trace through a fleet.

Run by ``test_client_distribution`` with the python of a venv holding nothing but the client wheel
and its dependencies, so every import here must come from that wheel. It connects from the
environment (``FleetClient.from_env``), publishes each event of the trace, prepares a context before
each assistant message (cycling through the three formats), answers the context tools in the three
provider shapes, and prints one JSON line of what it saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from ctxfleet_client import (
    FORMATS,
    AssistantMessageEvent,
    AssistantMessagePayload,
    ContextTools,
    CtxError,
    Event,
    FleetClient,
    PrepareRequest,
    SystemEvent,
    SystemPayload,
    ToolCall,
    ToolOutcomeEvent,
    ToolOutcomePayload,
    ToolSchema,
    ToolStatus,
    UserInputEvent,
    UserInputPayload,
)

SESSION = "client-dist"
RUN = "r1"
INSTANCE = "main"


def trace_events(path: Path) -> list[Event]:
    """The trace's lines as events of one run (docs/trace-format.md)."""
    events: list[Event] = []
    for index, text in enumerate(path.read_text().splitlines(), start=1):
        line = json.loads(text)
        common = {"event_key": f"e{index:06d}", "session_id": SESSION, "run_id": RUN, "instance_id": INSTANCE}
        match line["kind"]:
            case "system":
                events.append(SystemEvent(payload=SystemPayload(text=line["text"]), **common))
            case "user_input":
                events.append(UserInputEvent(payload=UserInputPayload(text=line["text"]), **common))
            case "assistant_message":
                calls = tuple(ToolCall(**c) for c in line.get("tool_calls", ()))
                payload = AssistantMessagePayload(text=line["text"], tool_calls=calls)
                events.append(AssistantMessageEvent(payload=payload, **common))
            case "tool_outcome":
                status = ToolStatus(line.get("status", "success"))
                payload = ToolOutcomePayload(call_id=line["call_id"], status=status, text=line["text"])
                events.append(ToolOutcomeEvent(payload=payload, **common))
    return events


def search_call(shape: str, query: str) -> object:
    """A model response calling context_search, in one provider's shape."""
    args = {"query": query}
    match shape:
        case "openai.chat":
            call = {"id": "c-chat", "type": "function"}
            fn = {"name": "context_search", "arguments": json.dumps(args)}
            return {"choices": [{"message": {"tool_calls": [call | {"function": fn}]}}]}
        case "openai.responses":
            item = {"type": "function_call", "call_id": "c-resp", "name": "context_search"}
            return {"output": [item | {"arguments": json.dumps(args)}]}
        case _:
            return {
                "content": [{"type": "tool_use", "id": "c-anth", "name": "context_search", "input": args}]
            }


async def main(trace: Path, query: str) -> dict[str, object]:
    seen: dict[str, object] = {"prepares": 0, "errors": [], "formats": {}, "answers": {}}
    async with await FleetClient.from_env() as fleet:
        events = trace_events(trace)
        # The tools the trace calls: an Anthropic body with tool blocks must declare them.
        names = {c.name for e in events if isinstance(e, AssistantMessageEvent) for c in e.payload.tool_calls}
        declared = tuple(ToolSchema(name=name) for name in sorted(names))
        for position, event in enumerate(events):
            following = events[position + 1] if position + 1 < len(events) else None
            if not isinstance(following, AssistantMessageEvent):
                await fleet.append(event)
                continue
            fmt = FORMATS[int(str(seen["prepares"])) % len(FORMATS)]
            request = PrepareRequest(
                session_id=SESSION,
                run_id=RUN,
                instance_id=INSTANCE,
                budget_tokens=4_000,
                format=fmt,
                tools=declared,
            )
            try:
                step = await fleet.append_and_prepare(event, request)
                formats = seen["formats"]
                assert isinstance(formats, dict)
                # .request holds the Responses or Anthropic body; a Chat body is .messages (and .tools).
                body = step.prepared.request if fmt != "openai.chat" else step.prepared.openai_messages()
                formats[fmt] = formats.get(fmt, 0) + (1 if body else 0)
                seen["prepares"] = int(str(seen["prepares"])) + 1
            except CtxError as err:
                errors = seen["errors"]
                assert isinstance(errors, list)
                errors.append(f"{err.code}: {err.message}")
        tools = ContextTools(fleet, session_id=SESSION, run_id=RUN, instance_id=INSTANCE)
        deadline = time.monotonic() + 30
        for shape in FORMATS:
            while True:  # the indexer catches up with the recorder on its own time
                answered = await tools.answer(search_call(shape, query))
                reply = answered.answers[0].reply
                if (reply is not None and getattr(reply, "hits", ())) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            answers = seen["answers"]
            assert isinstance(answers, dict)
            answers[shape] = answered.outcomes[0].payload.text.splitlines()[0]
    return seen


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))))
