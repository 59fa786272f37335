"""Threads of any length built from the bundled sample traces, for the load and peer benchmarks.

A thread of ``n`` records is the lines of one sample, then of the next, and so on round the six
(starting at ``start``, so sessions differ), cut at ``n``. Each further sample joins the first one's
run, without its system line, and with its call ids made unique by a suffix: a thread answers each
call once. A call its sample never answers (a trace that ends on a call) is left out: mid-thread it
would stay pending forever, and nothing after an open call can be compacted.
"""

from __future__ import annotations

from dataclasses import replace

from contracts import Event, PrepareRequest
from infra import SAMPLES_DIR
from services.core.trace import TraceLine, read_trace
from ctxfleet_client.client import FleetClient
from services.edge.replay import ReplayOptions, trace_events

__all__ = ["publish_thread", "sample_events", "sample_lines"]


def _answered_only(lines: list[TraceLine]) -> list[TraceLine]:
    answered = {line.call_id for line in lines if line.kind == "tool_outcome"}
    return [
        replace(line, tool_calls=tuple(c for c in line.tool_calls if c.call_id in answered))
        if line.tool_calls
        else line
        for line in lines
    ]


_SAMPLES: list[list[TraceLine]] = [_answered_only(read_trace(p)) for p in sorted(SAMPLES_DIR.glob("*.jsonl"))]


def sample_lines(n: int, *, start: int = 0) -> list[TraceLine]:
    """``n`` trace lines from the bundled samples, one run, the first sample's system line only."""
    lines: list[TraceLine] = []
    lap = 0
    while len(lines) < n:
        sample = _SAMPLES[(start + lap) % len(_SAMPLES)]
        for line in sample:
            if lap and line.kind == "system":
                continue
            lines.append(_renamed(line, lap) if lap else replace(line, run=None))
            if len(lines) == n:
                break
        lap += 1
    return lines


def sample_events(session_id: str, n: int, *, start: int = 0, policy: str | None = None) -> list[Event]:
    """The events of ``sample_lines(n, start=start)`` for one session (one thread, stable keys)."""
    return trace_events(sample_lines(n, start=start), ReplayOptions(session_id=session_id, policy=policy))


async def publish_thread(client: FleetClient, events: list[Event]) -> PrepareRequest:
    """Publish ``events`` (one thread) and wait until the last is readable; the thread's gpt-4o prepare."""
    for event in events:
        await client.append(event)
    last = events[-1]
    request = PrepareRequest(
        session_id=last.session_id,
        run_id=last.run_id,
        instance_id=last.instance_id,
        model_profile="gpt-4o",
    )
    await client.prepare(
        request.model_copy(update={"after_event_key": last.event_key, "wait_ms": 60_000}), timeout=90
    )
    return request


def _renamed(line: TraceLine, lap: int) -> TraceLine:
    calls = tuple(replace(c, call_id=f"{c.call_id}-{lap}") for c in line.tool_calls)
    call_id = f"{line.call_id}-{lap}" if line.call_id is not None else None
    return replace(line, run=None, tool_calls=calls, call_id=call_id)
