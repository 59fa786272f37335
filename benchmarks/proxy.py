"""``ctxfleet proxy`` on a real fleet: the latency it adds to a model call, and the tokens it saves.

Every bundled sample trace is played as an OpenAI Chat conversation against a scripted upstream
(``tests.fixtures.scripted_upstream``, answering each request with the trace's own next answer):
each request is sent once straight to the upstream and once through the proxy, taking turns, so the
two see the same machine. With streaming, the first-token delay is the time to the first body byte.
The added latency is the proxy's p50/p99 minus the direct call's; of it, the fleet's calls (the
appends and the prepare, read-your-writes wait included) are timed apart. Tokens: o200k tokens of the
messages sent upstream through the proxy (a 16k budget) against the unmanaged conversation's, summed
over every request.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
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


@dataclass
class _Run:
    """What the benchmark collects: times by series, in ms, and token sums."""

    upstream: ScriptedUpstream
    urls: dict[str, str]
    fleet_ms: list[float]
    times: dict[str, list[float]] = field(default_factory=dict)
    sent: int = 0
    unmanaged: int = 0
    requests: int = 0

    async def play(self, http: httpx2.AsyncClient, sample: Path, *, stream: bool) -> None:
        """One sample as a conversation: every answer of the trace is asked for, direct and proxied."""
        mode = "sse" if stream else "json"
        headers = {"authorization": "Bearer bench", "ctx-thread": f"b-{uuid.uuid4().hex[:12]}"}
        messages: list[dict[str, Any]] = []
        for line in read_trace(sample):
            message = _message(line)
            if message is None:
                continue
            if message["role"] == "assistant" and any(m["role"] == "user" for m in messages):
                said = Said(text=line.text, calls=tuple((c.call_id, c.name, c.args) for c in line.tool_calls))
                self.upstream.script(said, said)
                body = {"model": "gpt-4o", "messages": messages, "stream": stream}
                for name, base in self.urls.items():
                    self.fleet_ms.clear()
                    first, whole = await _timed(http, f"{base}/chat/completions", body, headers)
                    self.times.setdefault(f"{name}_{mode}", []).append(whole)
                    if stream:
                        self.times.setdefault(f"{name}_first", []).append(first)
                    if name == "proxy":
                        self.times.setdefault(f"fleet_{mode}", []).append(sum(self.fleet_ms))
                if not stream:
                    self.sent += _tokens(self.upstream.received[-1].body["messages"])
                    self.unmanaged += _tokens(messages)
                    self.requests += 1
            messages.append(message)

    def report(self) -> dict[str, object]:
        """p50/p99 of each series and the token sums."""
        out: dict[str, object] = {"requests": self.requests, "budget": _BUDGET}
        for mode in ("json", "sse", "first"):
            for pct in (50, 99):
                direct = percentile(self.times[f"direct_{mode}"], pct)
                proxied = percentile(self.times[f"proxy_{mode}"], pct)
                out[f"{mode}_p{pct}_ms"] = {
                    "direct": round(direct, 2),
                    "proxy": round(proxied, 2),
                    "added": round(proxied - direct, 2),
                }
        for mode in ("json", "sse"):
            calls = self.times[f"fleet_{mode}"]
            out[f"fleet_calls_{mode}_ms"] = {
                "p50": round(percentile(calls, 50), 2),
                "p99": round(percentile(calls, 99), 2),
            }
        out["tokens_upstream"] = self.sent
        out["tokens_unmanaged"] = self.unmanaged
        out["tokens_saved_share"] = round(1 - self.sent / self.unmanaged, 3) if self.unmanaged else 0.0
        return out


def _time_fleet_calls(client: FleetClient) -> list[float]:
    """Time the proxy's appends and prepares: the part of its added latency that is the fleet's."""
    spent: list[float] = []

    def timed(call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def run(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await call(*args, **kwargs)
            finally:
                spent.append((time.perf_counter() - started) * 1000)

        return run

    client.append = timed(client.append)  # type: ignore[method-assign,assignment]
    client.prepare = timed(client.prepare)  # type: ignore[method-assign,assignment]
    return spent


async def bench_proxy(servers: Servers, settings: Settings) -> dict[str, object]:
    """Added latency per request (p50/p99, JSON and SSE, first token) and tokens sent upstream."""
    fleet = await start_fleet(settings, servers)
    upstream = ScriptedUpstream()
    try:
        async with (
            await FleetClient.connect(servers.nats_urls) as client,
            httpx2.AsyncClient(timeout=60) as http,
            serve(upstream.app()) as upstream_url,
        ):
            fleet_ms = _time_fleet_calls(client)
            config = ProxyConfig(openai_url=f"{upstream_url}/v1", budget_tokens=_BUDGET)
            async with serve(build_app(client, http, config)) as proxy_url:
                run = _Run(upstream, {"direct": f"{upstream_url}/v1", "proxy": f"{proxy_url}/v1"}, fleet_ms)
                for stream in (False, True):
                    for sample in sorted(SAMPLES_DIR.glob("*.jsonl")):
                        await run.play(http, sample, stream=stream)
    finally:
        await fleet.stop()
    return run.report()
