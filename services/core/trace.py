"""Reading traces in the format of TRACE_FORMAT.md (JSONL, one event per line)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import JsonValue, ValidationError

from contracts.task_budgets import CallUsage

__all__ = ["TraceCall", "TraceFormatError", "TraceLine", "read_trace"]

_KINDS = ("system", "user_input", "assistant_message", "tool_outcome")
_STATUSES = ("success", "error", "timeout", "unknown")


class TraceFormatError(ValueError):
    """A trace line that does not follow the format; says which line and why."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.line = line


@dataclass(frozen=True, slots=True)
class TraceCall:
    call_id: str
    name: str
    args: dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class TraceLine:
    line: int
    kind: str
    text: str
    tool_calls: tuple[TraceCall, ...] = ()
    call_id: str | None = None
    status: str = "success"
    run: str | None = None
    ts: str | None = None
    extra: dict[str, JsonValue] = field(default_factory=dict)
    # What the provider reported for the call that produced an assistant message.
    usage: CallUsage | None = None


def read_trace(path: Path) -> list[TraceLine]:
    with path.open(encoding="utf-8") as fh:
        return list(_parse(str(path), fh))


def _parse(name: str, lines: Iterator[str]) -> Iterator[TraceLine]:
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(name, number, f"not JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise TraceFormatError(name, number, "a trace line is a JSON object")
        kind = obj.get("kind")
        if kind not in _KINDS:
            raise TraceFormatError(name, number, f"unknown kind {kind!r}")
        text = obj.get("text", "")
        if not isinstance(text, str):
            raise TraceFormatError(name, number, "text must be a string")
        status = obj.get("status", "success")
        if status not in _STATUSES:
            raise TraceFormatError(name, number, f"unknown status {status!r}")
        calls = tuple(_call(name, number, c) for c in obj.get("tool_calls") or ())
        call_id = obj.get("call_id")
        if kind == "tool_outcome" and not isinstance(call_id, str):
            raise TraceFormatError(name, number, "a tool_outcome needs a call_id")
        usage = _usage(name, number, kind, obj.get("usage"))
        yield TraceLine(
            line=number,
            kind=kind,
            text=text,
            tool_calls=calls,
            call_id=call_id,
            status=status,
            run=obj.get("run"),
            ts=obj.get("ts"),
            usage=usage,
        )


def _usage(name: str, number: int, kind: str, raw: object) -> CallUsage | None:
    if raw is None:
        return None
    if kind != "assistant_message":
        raise TraceFormatError(name, number, "usage belongs to an assistant_message")
    try:
        return CallUsage.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise TraceFormatError(name, number, f"usage: {first['loc']}: {first['msg']}") from None


def _call(name: str, number: int, raw: object) -> TraceCall:
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("call_id"), str)
        or not isinstance(raw.get("name"), str)
    ):
        raise TraceFormatError(name, number, "a tool call needs a string call_id and name")
    args = raw.get("args", {})
    if not isinstance(args, dict):
        # Some agents log arguments as a raw string; keep it rather than guess its structure.
        args = {"input": args}
    return TraceCall(call_id=raw["call_id"], name=raw["name"], args=args)
