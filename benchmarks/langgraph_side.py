"""Context time side by side with LangGraph's Postgres checkpointer, same PostgreSQL.

One conversation of ``n`` messages (50, 500, 5,000) is built from the bundled samples
(``benchmarks.conversation``) and stored in both:

- LangGraph: a ``StateGraph(MessagesState)`` compiled with ``AsyncPostgresSaver`` is invoked once
  with every message (system / human / AI with tool calls / tool), so its latest checkpoint holds them.
  Its context time is what a LangGraph agent pays before a model call: ``saver.aget_tuple(config)``
  (the latest checkpoint, messages deserialized), a tiktoken count of each message (o200k_base, text
  and tool calls), then ``trim_messages(strategy="last", include_system=True, start_on="human")`` to
  the budget over those counts (each message counted once: the cheapest honest use of the API).
- ctxfleet: the same messages published as events to a fleet process (all five workers; the budgeter
  compacts what exceeds the gpt-4o budget), then the prepare round trip (gpt-4o profile) once the view
  is settled (no compaction pending).

The budget of the trim is the ``input_budget`` of ctxfleet's reply, so both fit the same window. The
two are timed interleaved (one LangGraph, one ctxfleet, …) in this process, so machine noise falls on
both alike. Figures per size: p50/p99 of each, and the ratio ctxfleet / LangGraph (< 1: ctxfleet faster).

A third timing in the same rounds is the floor under ctxfleet's figure (``benchmarks/echo_floor.py``):
the same request to a process that answers at once with that size's prepared context, bytes for bytes,
and the client's same parse. ``fleet_share`` is ctxfleet's p50 above that floor: what the fleet's
own work (the thread's one statement, the view cache, the reply) costs.

``make bench BENCH_ARGS="--only langgraph"`` (needs the ``bench`` extra, which ``make bench`` installs).
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
import uuid
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NatsClient

from contracts import PreparedContext, PrepareRequest
from services.core.tokens import counter_for
from services.core.trace import TraceLine
from ctxfleet_client.client import DEADLINE_HEADER, FleetClient
from services.edge.replay import percentile
from services.settings import parse_nats_urls

from .conversation import publish_thread, sample_events, sample_lines
from .echo_floor import EchoFloor
from .fleet_process import ALL_WORKERS, FleetProcess, fleet_env, prepare_servers

__all__ = ["SIZES", "bench_langgraph"]

SIZES: dict[int, int] = {50: 200, 500: 100, 5_000: 30}  # messages → interleaved rounds
_COUNTER = counter_for("o200k_base")


def _messages(lines: list[TraceLine]) -> list[Any]:
    """The trace lines as LangChain messages, with stable ids."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    out: list[Any] = []
    for n, line in enumerate(lines):
        mid = f"m{n}"
        if line.kind == "system":
            out.append(SystemMessage(content=line.text, id=mid))
        elif line.kind == "user_input":
            out.append(HumanMessage(content=line.text, id=mid))
        elif line.kind == "assistant_message":
            calls = [{"name": c.name, "args": dict(c.args), "id": c.call_id} for c in line.tool_calls]
            out.append(AIMessage(content=line.text, tool_calls=calls, id=mid))
        else:
            status = "success" if line.status == "success" else "error"
            out.append(ToolMessage(content=line.text, tool_call_id=line.call_id or "", status=status, id=mid))
    return out


def _text(message: Any) -> str:
    content = message.content if isinstance(message.content, str) else json.dumps(message.content)
    calls = getattr(message, "tool_calls", None)
    return content + (json.dumps(calls, ensure_ascii=False) if calls else "")


def _langgraph_context(messages: list[Any], budget: int) -> list[Any]:
    from langchain_core.messages import trim_messages

    counts = {m.id: _COUNTER.count(_text(m)) + 4 for m in messages}

    def count(batch: list[Any]) -> int:
        return sum(counts[m.id] for m in batch)

    return list(
        trim_messages(
            messages,
            max_tokens=budget,
            token_counter=count,
            strategy="last",
            include_system=True,
            start_on="human",
        )
    )


async def _settle(
    client: FleetClient, request: PrepareRequest, *, bound_s: float = 180.0
) -> tuple[Any, bool]:
    """Prepare until the view has not changed for 3 s and a prepare waits on no compaction, within
    ``bound_s``; whether it settled."""
    deadline = time.monotonic() + bound_s
    prepared = await client.prepare(request, timeout=90)
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        again = await client.prepare(request, timeout=90)
        if again.view_revision != prepared.view_revision or again.compaction_wait_ms:
            stable_since = time.monotonic()
        prepared = again
        if time.monotonic() - stable_since >= 3.0:
            return prepared, True
    return prepared, False


async def bench_langgraph(
    nats_url: str, database_url: str, tmp: Path, *, sizes: dict[int, int] | None = None
) -> dict[str, object]:
    """p50/p99 context time of LangGraph (checkpoint read + count + trim) and ctxfleet (prepare)."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    await prepare_servers(nats_url, database_url, tmp / "data")
    results: dict[str, object] = {"rounds": dict(sizes or SIZES)}
    env = fleet_env(nats_url, database_url, tmp / "data")
    with FleetProcess(ALL_WORKERS, env, tmp / "langgraph-fleet.log") as _fleet:
        async with (
            AsyncPostgresSaver.from_conn_string(database_url) as saver,
            await FleetClient.connect(nats_url, name="langgraph-side") as client,
            await nats.connect(list(parse_nats_urls(nats_url)), name="langgraph-side-floor") as floor_nc,
        ):
            await saver.setup()
            builder = StateGraph(MessagesState)
            builder.add_node("agent", lambda state: {"messages": []})
            builder.add_edge(START, "agent")
            builder.add_edge("agent", END)
            graph = builder.compile(checkpointer=saver)
            for n, rounds in (sizes or SIZES).items():
                session = f"lg-{uuid.uuid4().hex[:10]}"
                lines = sample_lines(n, start=1)
                events = sample_events(session, n, start=1)
                config: Any = {"configurable": {"thread_id": session}}
                await graph.ainvoke({"messages": _messages(lines)}, config)
                request = await publish_thread(client, events)
                settled, steady = await _settle(client, request)
                budget = settled.budget_report.input_budget
                lg_ms: list[float] = []
                cf_ms: list[float] = []
                floor_ms: list[float] = []
                floor = _Floor(floor_nc, f"floor.{uuid.uuid4().hex[:10]}", request)
                kept: list[Any] = []
                waits: list[int] = []
                with EchoFloor(nats_url, floor.subject, settled.model_dump_json().encode(), tmp):
                    for _ in range(rounds):
                        # Each side pays the collections its own allocations trigger, not the other's:
                        # one process times all three, and LangGraph's deserialized checkpoint left
                        # garbage that the next prepare's parse would otherwise collect (and the other
                        # way round).
                        gc.collect()
                        started = time.perf_counter()
                        snapshot = await saver.aget_tuple(config)
                        assert snapshot is not None
                        kept = _langgraph_context(snapshot.checkpoint["channel_values"]["messages"], budget)
                        lg_ms.append((time.perf_counter() - started) * 1000)
                        del snapshot
                        gc.collect()
                        started = time.perf_counter()
                        prepared = await client.prepare(request, timeout=30)
                        cf_ms.append((time.perf_counter() - started) * 1000)
                        waits.append(prepared.compaction_wait_ms)
                        gc.collect()
                        floor_ms.append(await floor.time())
                lg = {"p50_ms": round(percentile(lg_ms, 50), 2), "p99_ms": round(percentile(lg_ms, 99), 2)}
                cf = {"p50_ms": round(percentile(cf_ms, 50), 2), "p99_ms": round(percentile(cf_ms, 99), 2)}
                fl = {
                    "p50_ms": round(percentile(floor_ms, 50), 2),
                    "p99_ms": round(percentile(floor_ms, 99), 2),
                }
                results[f"messages_{n}"] = {
                    "budget_tokens": budget,
                    "langgraph": {
                        **lg,
                        "messages_kept": len(kept),
                        "tokens_kept": sum(_COUNTER.count(_text(m)) + 4 for m in kept),
                    },
                    "ctxfleet": {
                        **cf,
                        "messages": len(prepared.messages),
                        "tokens": prepared.budget_report.used.total,
                        "view_revision": prepared.view_revision,
                        "settled_before_timing": steady,
                        "prepares_waiting_on_compaction": sum(1 for w in waits if w),
                        "compaction_wait_ms_max": max(waits, default=0),
                        "reply_bytes": len(prepared.model_dump_json()),
                    },
                    "floor": {**fl, "fleet_share_p50_ms": round(cf["p50_ms"] - fl["p50_ms"], 2)},
                    "ratio_ctxfleet_over_langgraph": {
                        "p50": round(cf["p50_ms"] / lg["p50_ms"], 3) if lg["p50_ms"] else None,
                        "p99": round(cf["p99_ms"] / lg["p99_ms"], 3) if lg["p99_ms"] else None,
                    },
                }
    return results


class _Floor:
    """The prepare's request sent to the echo responder, its reply parsed as the client parses one."""

    def __init__(self, nc: NatsClient, subject: str, request: PrepareRequest) -> None:
        self.subject = subject
        self._nc = nc
        self._body = request.model_dump_json().encode()

    async def time(self) -> float:
        """One round trip with the client's parse, in ms."""
        started = time.perf_counter()
        deadline = str(int(time.time() * 1000) + 30_000)
        reply = await self._nc.request(
            self.subject, self._body, timeout=30, headers={DEADLINE_HEADER: deadline}
        )
        PreparedContext.model_validate_json(reply.data)
        return (time.perf_counter() - started) * 1000
