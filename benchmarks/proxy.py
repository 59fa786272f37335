"""``ctxfleet proxy`` on a real fleet: the latency it adds to a model call, and the tokens it saves.

Every bundled sample trace is played as an OpenAI Chat conversation against a scripted upstream
(``tests.fixtures.scripted_upstream``, answering each request with the trace's own next answer):
each request is sent once straight to the upstream and once through the proxy, taking turns, so the
two see the same machine. With streaming, the first-token delay is the time to the first body byte.
The added latency is the proxy's p50/p99 minus the direct call's. Tokens: o200k tokens of the
messages sent upstream through the proxy (a 16k budget) against the unmanaged conversation's, summed
over every request.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx2

from ctxfleet_client.client import FleetClient
from infra import SAMPLES_DIR
from infra.runtime import Servers, start_fleet
from services.core.tokens import counter_for
from services.core.trace import TraceLine, read_trace
from services.edge.proxy import ProxyConfig, build_app
from services.edge.replay import percentile
from services.settings import Settings
from tests.fixtures.scripted_upstream import Said, ScriptedUpstream, serve

__all__ = ["bench_proxy"]

_BUDGET = 16_000
_O200K = counter_for("o200k_base")


def _message(line: TraceLine) -> dict[str, Any] | None:
    match line.kind:
        case "system":
            return {"role": "system", "content": line.text}
        case "user_input":
            return {"role": "user", "content": line.text}
        case "assistant_message":
            calls = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.args)},
                }
                for c in line.tool_calls
            ]
            return {
                "role": "assistant",
                "content": line.text or None,
                **({"tool_calls": calls} if calls else {}),
            }
        case "tool_outcome":
            return {"role": "tool", "tool_call_id": line.call_id, "content": line.text}
        case _:
            return None


def _tokens(messages: list[dict[str, Any]]) -> int:
    texts = [m.get("content") or "" for m in messages]
    texts += [c["function"]["arguments"] for m in messages for c in m.get("tool_calls", ())]
    return sum(_O200K.count(t) for t in texts)


async def _timed(
    http: httpx2.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[float, float]:
    """(first byte, whole response) in ms."""
    started = time.perf_counter()
    first = 0.0
    async with http.stream("POST", url, json=body, headers=headers) as response:
        async for _ in response.aiter_bytes():
            first = first or time.perf_counter() - started
        response.raise_for_status()
    return first * 1000, (time.perf_counter() - started) * 1000


async def bench_proxy(servers: Servers, settings: Settings) -> dict[str, object]:
    """Added latency per request (p50/p99, JSON and SSE, first token) and tokens sent upstream."""
    fleet = await start_fleet(settings, servers)
    upstream = ScriptedUpstream()
    times: dict[str, list[float]] = {}
    sent = unmanaged = requests = 0
    try:
        async with (
            await FleetClient.connect(servers.nats_urls) as client,
            httpx2.AsyncClient(timeout=60) as http,
            serve(upstream.app()) as upstream_url,
        ):
            config = ProxyConfig(openai_url=f"{upstream_url}/v1", budget_tokens=_BUDGET)
            async with serve(build_app(client, http, config)) as proxy_url:
                for stream in (False, True):
                    mode = "sse" if stream else "json"
                    for sample in sorted(SAMPLES_DIR.glob("*.jsonl")):
                        headers = {
                            "authorization": "Bearer bench",
                            "ctx-thread": f"b-{uuid.uuid4().hex[:12]}",
                        }
                        messages: list[dict[str, Any]] = []
                        for line in read_trace(sample):
                            message = _message(line)
                            if message is None:
                                continue
                            if message["role"] == "assistant" and any(m["role"] == "user" for m in messages):
                                said = Said(
                                    text=line.text,
                                    calls=tuple((c.call_id, c.name, c.args) for c in line.tool_calls),
                                )
                                upstream.script(said, said)
                                body = {"model": "gpt-4o", "messages": messages, "stream": stream}
                                for name, base in (
                                    ("direct", f"{upstream_url}/v1"),
                                    ("proxy", f"{proxy_url}/v1"),
                                ):
                                    first, whole = await _timed(
                                        http, f"{base}/chat/completions", body, headers
                                    )
                                    times.setdefault(f"{name}_{mode}", []).append(whole)
                                    if stream:
                                        times.setdefault(f"{name}_first", []).append(first)
                                if not stream:
                                    sent += _tokens(upstream.received[-1].body["messages"])
                                    unmanaged += _tokens(messages)
                                    requests += 1
                            messages.append(message)
    finally:
        await fleet.stop()
    report: dict[str, object] = {"requests": requests, "budget": _BUDGET}
    for mode in ("json", "sse", "first"):
        for pct in (50, 99):
            direct = percentile(times[f"direct_{mode}"], pct)
            proxied = percentile(times[f"proxy_{mode}"], pct)
            report[f"{mode}_p{pct}_ms"] = {
                "direct": round(direct, 2),
                "proxy": round(proxied, 2),
                "added": round(proxied - direct, 2),
            }
    report["tokens_upstream"] = sent
    report["tokens_unmanaged"] = unmanaged
    report["tokens_saved_share"] = round(1 - sent / unmanaged, 3) if unmanaged else 0.0
    return report
