"""Replaying a trace through the fleet exactly as an agent runtime would.

Each event is published; before each assistant message the replayer asks for a prepared context
(purpose ``action``) whose watermark is the last event it published. The report compares what
the fleet prepared with what an agent sending its whole history would have sent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import assert_never

from pydantic import JsonValue

from contracts import (
    EventKind,
    RunStatusEvent,
    RunStatusPayload,
    AssistantMessageEvent,
    AssistantMessagePayload,
    Event,
    PrepareRequest,
    SystemEvent,
    SystemPayload,
    ToolCall,
    ToolOutcomeEvent,
    ToolOutcomePayload,
    ToolStatus,
    UserInputEvent,
    UserInputPayload,
)

from ctxfleet_client.client import FleetClient
from contracts.exceptions import CtxError, PermissionDenied
from services.core.render import (
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    RenderedCall,
    arguments_json,
    content_of,
    count_record,
)
from services.core.tokens import ENCODINGS, counter_for
from services.core.trace import TraceLine

__all__ = [
    "ReplayOptions",
    "ReplayReport",
    "full_history_tokens",
    "percentile",
    "replay_trace",
    "trace_events",
]


@dataclass(frozen=True)
class ReplayOptions:
    """How to replay: into which session, against which budget, and where to dump contexts."""

    session_id: str
    instance_id: str = "main"
    model_profile: str | None = "gpt-4o"
    budget_tokens: int | None = None
    dump_dir: Path | None = None
    wait_ms: int = 10_000
    policy: str | None = None


@dataclass
class ReplayReport:
    """The JSON report: one entry per prepare, and totals."""

    prepares: list[dict[str, JsonValue]] = field(default_factory=list)
    totals: dict[str, JsonValue] = field(default_factory=dict)

    def as_json(self) -> dict[str, JsonValue]:
        """The report as written by ``ctxfleet replay --report``."""
        return {"prepares": list(self.prepares), "totals": dict(self.totals)}


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def trace_events(lines: Sequence[TraceLine], options: ReplayOptions) -> list[Event]:
    """The events a runtime would publish for a trace: a new run per ``run`` value, stable keys.

    A session has one active run at a time, so before a new run's first event the previous run is
    closed with a ``run_status: completed`` event (key ``end-<run>``), as a runtime would.
    """
    events: list[Event] = []
    run_names: dict[str | None, str] = {}
    current: str | None = None
    for index, line in enumerate(lines, start=1):
        run_id = run_names.setdefault(line.run, f"{options.session_id}-r{len(run_names) + 1}")
        if current is not None and run_id != current:
            events.append(
                RunStatusEvent(
                    event_key=f"end-{current}",
                    session_id=options.session_id,
                    run_id=current,
                    instance_id=options.instance_id,
                    payload=RunStatusPayload(status="completed"),
                )
            )
        current = run_id
        common: dict[str, object] = {
            "event_key": f"e{index:06d}",
            "session_id": options.session_id,
            "run_id": run_id,
            "instance_id": options.instance_id,
            "client_ts": _parse_ts(line.ts),
            "policy": options.policy if index == 1 else None,
        }
        events.append(_event(line, common))
    return events


def _parse_ts(ts: str | None) -> datetime | None:
    if not ts:
        return None
    try:
        return datetime.fromisoformat(ts)
    except ValueError:
        return None


def _event(line: TraceLine, common: dict[str, object]) -> Event:
    try:
        kind = EventKind(line.kind)
    except ValueError:
        raise ValueError(f"line {line.line}: unknown kind {line.kind!r}") from None
    match kind:
        case EventKind.SYSTEM:
            return SystemEvent(payload=SystemPayload(text=line.text), **common)
        case EventKind.USER_INPUT:
            return UserInputEvent(payload=UserInputPayload(text=line.text), **common)
        case EventKind.ASSISTANT_MESSAGE:
            calls = tuple(ToolCall(call_id=c.call_id, name=c.name, args=c.args) for c in line.tool_calls)
            return AssistantMessageEvent(
                payload=AssistantMessagePayload(text=line.text, tool_calls=calls, usage=line.usage), **common
            )
        case EventKind.TOOL_OUTCOME:
            payload = ToolOutcomePayload(
                call_id=line.call_id or "", status=ToolStatus(line.status), text=line.text
            )
            return ToolOutcomeEvent(payload=payload, **common)
        case (
            EventKind.RESOURCE_ACTIVATED
            | EventKind.CHILD_RESULT
            | EventKind.RUN_STATUS
            | EventKind.CONTEXT_EXPORT
            | EventKind.CONTEXT_RESET
            | EventKind.STATE_PATCH
            | EventKind.OPERATION_RECONCILE
            | EventKind.PHASE_CHANGE
        ):
            # The trace format (docs/trace-format.md) carries a conversation only; a new kind is
            # decided here: add it to the format, or list it among these.
            raise ValueError(f"line {line.line}: kind {line.kind!r} is not in the trace format")
        case _:
            assert_never(kind)


def full_history_tokens(event: Event) -> int:
    """What this event costs an agent that sends its whole history (o200k_base, untrimmed)."""
    payload = event.payload.model_dump(mode="json")
    text = payload.get("text", "")
    calls = (
        [RenderedCall(c.call_id, c.name, arguments_json(c.args)) for c in event.payload.tool_calls]
        if isinstance(event, AssistantMessageEvent)
        else []
    )
    counters = {name: counter_for(name) for name in ENCODINGS}
    tokens = (
        count_record(counters, content_of(event.kind, payload, str(text)), calls).o200k_base
        + MESSAGE_OVERHEAD
    )
    if isinstance(event, ToolOutcomeEvent):
        tokens += counters["o200k_base"].count(event.payload.call_id)  # sent as the message's tool_call_id
    return tokens


async def replay_trace(
    client: FleetClient,
    lines: Sequence[TraceLine],
    options: ReplayOptions,
    *,
    clock: Callable[[], float] = time.perf_counter,
    on_event: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    """Publish a trace and prepare before each assistant message; returns the report.

    ``on_event(done, total)`` is called after each event is stored (the CLI's progress bar).
    """
    report = ReplayReport()
    latencies: list[float] = []
    full_so_far: dict[str, int] = {}
    last_key: dict[str, str] = {}
    errors = 0
    if options.dump_dir is not None:
        options.dump_dir.mkdir(parents=True, exist_ok=True)
    events = trace_events(lines, options)
    line_of = iter(lines)
    for done, event in enumerate(events, 1):
        thread = event.thread_id
        if isinstance(event, RunStatusEvent):
            await client.append(event)
            last_key[thread] = event.event_key
            continue
        line = next(line_of)
        if isinstance(event, AssistantMessageEvent) and thread in last_key:
            entry, latency_ms, ok = await _prepare(
                client, event, last_key[thread], options, len(report.prepares) + 1, clock
            )
            entry["event_line"] = line.line
            entry["full_history_tokens"] = full_so_far.get(thread, 0) + REPLY_PRIMING
            report.prepares.append(entry)
            if ok:
                latencies.append(latency_ms)
            else:
                errors += 1
        await client.append(event)
        last_key[thread] = event.event_key
        full_so_far[thread] = full_so_far.get(thread, 0) + full_history_tokens(event)
        if on_event is not None:
            on_event(done, len(events))
    ok_prepares = [p for p in report.prepares if "error" not in p]
    compactions, failures = await _compactions(client, list(last_key))
    report.totals = {
        "session_id": options.session_id,
        "events": len(lines),
        "prepares": len(report.prepares),
        "errors": errors,
        "prepared_tokens_sum": sum(_int(p["prepared_tokens"]) for p in ok_prepares),
        "full_history_tokens_sum": sum(_int(p["full_history_tokens"]) for p in report.prepares),
        "latency_ms_p50": round(percentile(latencies, 50), 3),
        "latency_ms_p99": round(percentile(latencies, 99), 3),
        "over_budget": sum(1 for p in ok_prepares if p.get("over_budget")),
        "compactions": compactions,
        "compaction_failures": failures,
        "compaction_waits": sum(1 for p in ok_prepares if _int(p.get("compaction_wait_ms", 0)) > 0),
        "reductions": sum(_int(p.get("reductions", 0)) for p in ok_prepares),
    }
    return report


async def _compactions(client: FleetClient, thread_ids: list[str]) -> tuple[int | None, int | None]:
    """Summaries and failed compactions of the threads; ``None`` for an identity that may not inspect
    (a tenant's runtime: inspecting is the operator's)."""
    compactions, failures = 0, 0
    try:
        for thread_id in thread_ids:
            inspection = await client.inspect(thread_id, limit=1)
            compactions += inspection.summaries
            failures += inspection.compaction_failures
    except PermissionDenied:
        return None, None
    return compactions, failures


def _int(value: JsonValue | None) -> int:
    assert isinstance(value, int)
    return value


async def _prepare(
    client: FleetClient,
    event: Event,
    after: str,
    options: ReplayOptions,
    ordinal: int,
    clock: Callable[[], float],
) -> tuple[dict[str, JsonValue], float, bool]:
    request = PrepareRequest(
        session_id=event.session_id,
        run_id=event.run_id,
        instance_id=event.instance_id,
        model_profile=options.model_profile,
        budget_tokens=options.budget_tokens,
        after_event_key=after,
        wait_ms=options.wait_ms,
    )
    started = clock()
    try:
        prepared = await client.prepare(request)
    except CtxError as exc:
        latency = (clock() - started) * 1000
        failed: dict[str, JsonValue] = {"seq": ordinal, "error": exc.code.value, "message": exc.message}
        failed["latency_ms"] = round(latency, 3)
        return failed, latency, False
    latency = (clock() - started) * 1000
    if options.dump_dir is not None:
        (options.dump_dir / f"{ordinal:04d}.json").write_text(
            prepared.model_dump_json(indent=2) + "\n", encoding="utf-8"
        )
    return (
        {
            "seq": ordinal,
            "prepared_id": prepared.prepared_id,
            "prepared_tokens": prepared.budget_report.used.total,
            "input_budget": prepared.budget_report.input_budget,
            "messages": len(prepared.messages),
            "omitted_blocks": len(prepared.omitted),
            "latency_ms": round(latency, 3),
            "summary_revision": prepared.view_revision,
            "over_budget": prepared.budget_report.used.total > prepared.budget_report.input_budget,
            "compaction_wait_ms": prepared.compaction_wait_ms,
            "reductions": len(prepared.reductions),
        },
        latency,
        True,
    )
