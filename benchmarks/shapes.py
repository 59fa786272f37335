"""What each provider shape costs and caches, on the bundled samples replayed through a fleet.

For every prepare of every sample (gpt-4o profile, a 16k cap so compactions happen), the same context is
asked for in each shape — ``openai.chat``, ``openai.responses``, ``anthropic.messages`` — and measured:

- reply size: bytes of the ``PreparedContext`` JSON (what crosses the bus);
- request tokens: o200k tokens of the provider body as JSON (an estimate for Anthropic);
- Anthropic cache reuse: of each request, the tokens before the last breakpoint of the previous request
  on the same thread when that prefix repeats unchanged (what the next call reads from the cache) —
  over consecutive prepares with no compaction between them, and over all of them;
- OpenAI prefix reuse (Chat and Responses cache automatically by prefix): of each request, the tokens
  of the longest run of leading items (tools, then messages / input items) equal to the previous
  request's, between compactions and over all.

Run with ``make bench BENCH_ARGS="--only shapes"``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from contracts import AssistantMessageEvent, PreparedContext, PrepareRequest, RequestFormat, ToolSchema
from infra import SAMPLES_DIR
from infra.runtime import Servers, start_fleet
from services.core.tokens import counter_for
from services.core.trace import read_trace
from ctxfleet_client.client import FleetClient
from services.edge.replay import ReplayOptions, trace_events
from services.settings import Settings

__all__ = ["bench_shapes"]

FORMATS: tuple[RequestFormat, ...] = ("openai.chat", "openai.responses", "anthropic.messages")
_COUNTER = counter_for("o200k_base")


def _body(prepared: PreparedContext) -> dict[str, Any]:
    if prepared.request is not None:
        return dict(prepared.request)
    return {
        "messages": prepared.openai_messages(),
        "tools": [t.model_dump(mode="json") for t in prepared.tools],
    }


def _tokens(value: object) -> int:
    return _COUNTER.count(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _flat(request: dict[str, Any]) -> list[Any]:
    flat: list[Any] = [*request.get("tools", []), *request.get("system", [])]
    for message in request.get("messages", []):
        flat += [{"role": message["role"], **block} for block in message["content"]]
    return flat


def _cached_prefix(request: dict[str, Any]) -> list[Any]:
    """The request's content blocks in order (tools, system, messages' blocks) up to its last breakpoint."""
    flat = _flat(request)
    marked = [n for n, block in enumerate(flat) if "cache_control" in block]
    return _unmarked(flat[: marked[-1] + 1]) if marked else []


def _reused(previous: dict[str, Any], current: dict[str, Any]) -> int:
    """Tokens of ``current`` the cache answers: the previous request's marked prefix, if it repeats."""
    prefix = _cached_prefix(previous)
    flat = _flat(current)
    return _tokens(prefix) if prefix and _unmarked(flat[: len(prefix)]) == prefix else 0


def _items(body: dict[str, Any]) -> list[Any]:
    return [*body.get("tools", []), *body.get("messages", body.get("input", []))]


def _common_prefix(previous: dict[str, Any], current: dict[str, Any]) -> int:
    """Tokens of the leading items ``current`` shares with ``previous`` (what a prefix cache answers)."""
    if previous.get("instructions") != current.get("instructions"):
        return 0
    before, now = _items(previous), _items(current)
    n = 0
    while n < min(len(before), len(now)) and before[n] == now[n]:
        n += 1
    head = [current["instructions"]] if current.get("instructions") else []
    return _tokens([*head, *now[:n]]) if n or head else 0


async def bench_shapes(
    servers: Servers, settings: Settings, traces: list[Path] | None = None
) -> dict[str, object]:
    paths = traces if traces is not None else sorted(SAMPLES_DIR.glob("*.jsonl"))
    fleet = await start_fleet(settings, servers)
    sizes: dict[str, list[int]] = {f: [] for f in FORMATS}
    tokens: dict[str, list[int]] = {f: [] for f in FORMATS}
    reuse_all: list[tuple[int, int]] = []
    reuse_steady: list[tuple[int, int]] = []
    prefix_all: dict[str, list[tuple[int, int]]] = {f: [] for f in FORMATS[:2]}
    prefix_steady: dict[str, list[tuple[int, int]]] = {f: [] for f in FORMATS[:2]}
    earlier: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}
    try:
        async with await FleetClient.connect(servers.nats_urls) as client:
            for path in paths:
                options = ReplayOptions(session_id=f"shapes-{uuid.uuid4().hex[:10]}")
                last_key: dict[str, str] = {}
                previous: dict[str, tuple[int, dict[str, Any]]] = {}
                events = trace_events(read_trace(path), options)
                # The tools the trace calls: an Anthropic body with tool blocks must declare them.
                called = {
                    c.name
                    for e in events
                    if isinstance(e, AssistantMessageEvent)
                    for c in e.payload.tool_calls
                }
                tools = tuple(ToolSchema(name=name) for name in sorted(called))
                for event in events:
                    thread = event.thread_id
                    if isinstance(event, AssistantMessageEvent) and thread in last_key:
                        for fmt in FORMATS:
                            prepared = await client.prepare(
                                PrepareRequest(
                                    session_id=event.session_id,
                                    run_id=event.run_id,
                                    instance_id=event.instance_id,
                                    model_profile="gpt-4o",
                                    budget_tokens=16_000,
                                    after_event_key=last_key[thread],
                                    format=fmt,
                                    tools=tools,
                                    wait_ms=30_000,
                                )
                            )
                            body = _body(prepared)
                            sizes[fmt].append(len(prepared.model_dump_json()))
                            tokens[fmt].append(_tokens(body))
                            if fmt != "anthropic.messages":
                                total = tokens[fmt][-1]
                                if (thread, fmt) in earlier:
                                    revision, before = earlier[(thread, fmt)]
                                    hit = _common_prefix(before, body)
                                    prefix_all[fmt].append((hit, total))
                                    if revision == prepared.view_revision:
                                        prefix_steady[fmt].append((hit, total))
                                earlier[(thread, fmt)] = (prepared.view_revision, body)
                            if fmt == "anthropic.messages":
                                total = tokens[fmt][-1]
                                if thread in previous:
                                    revision, before = previous[thread]
                                    hit = _reused(before, body)
                                    reuse_all.append((hit, total))
                                    if revision == prepared.view_revision:
                                        reuse_steady.append((hit, total))
                                previous[thread] = (prepared.view_revision, body)
                    await client.append(event)
                    last_key[thread] = event.event_key
    finally:
        await fleet.stop()

    def share(pairs: list[tuple[int, int]]) -> float:
        return round(sum(h for h, _ in pairs) / max(1, sum(t for _, t in pairs)), 3)

    return {
        "prepares": len(sizes["openai.chat"]),
        "reply_bytes_mean": {f: round(sum(v) / max(1, len(v))) for f, v in sizes.items()},
        "request_tokens_mean": {f: round(sum(v) / max(1, len(v))) for f, v in tokens.items()},
        "anthropic_cache_reuse_between_compactions": share(reuse_steady),
        "anthropic_cache_reuse_all": share(reuse_all),
        "anthropic_pairs": {"between_compactions": len(reuse_steady), "all": len(reuse_all)},
        "openai_prefix_reuse_between_compactions": {f: share(v) for f, v in prefix_steady.items()},
        "openai_prefix_reuse_all": {f: share(v) for f, v in prefix_all.items()},
    }
