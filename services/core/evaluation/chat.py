"""A trace as an agent sending its whole history would send it: OpenAI chat messages in units.

A unit is what a baseline keeps or drops whole: a user message, or a tool group (an assistant
message and the results of all its calls). Splitting a group would send a tool call without its
result or a result without its call, which providers reject.
"""

from __future__ import annotations

from contracts import EventKind

from collections.abc import Sequence
from dataclasses import dataclass, replace

from typing import assert_never

from pydantic import JsonValue

from services.core.render import arguments_json
from services.core.trace import TraceLine

__all__ = ["ChatMsg", "History", "Unit", "history_of", "tool_content", "with_system_prompt"]

ChatMsg = dict[str, JsonValue]


@dataclass(frozen=True, slots=True)
class Unit:
    """Messages kept or dropped together; ``tool_results`` counts the tool messages among them."""

    messages: tuple[ChatMsg, ...]
    tool_results: int = 0


@dataclass(frozen=True, slots=True)
class History:
    """The system message, the run's task (the first user message) and every later unit."""

    system: tuple[ChatMsg, ...]
    task: tuple[ChatMsg, ...]
    units: tuple[Unit, ...]

    def messages(self) -> list[ChatMsg]:
        """Everything, in order."""
        return [*self.system, *self.task, *(m for u in self.units for m in u.messages)]


def tool_content(line: TraceLine) -> str:
    """A tool result's content: a failed status is stated, as the fleet states it."""
    return line.text if line.status == "success" else f"[tool status: {line.status}]\n{line.text}"


def history_of(lines: Sequence[TraceLine]) -> History:
    """The whole history of ``lines`` (one run), grouped; an open group (results missing) is kept open."""
    system: list[ChatMsg] = []
    task: list[ChatMsg] = []
    units: list[Unit] = []
    open_group: list[ChatMsg] | None = None
    results = 0

    def close() -> None:
        nonlocal open_group, results
        if open_group is not None:
            units.append(Unit(tuple(open_group), results))
        open_group, results = None, 0

    for line in lines:
        kind = EventKind(line.kind)
        match kind:
            case EventKind.SYSTEM:
                close()
                system.append({"role": "system", "content": line.text})
            case EventKind.USER_INPUT:
                close()
                message: ChatMsg = {"role": "user", "content": line.text}
                if task or units:
                    units.append(Unit((message,)))
                else:
                    task.append(message)
            case EventKind.ASSISTANT_MESSAGE:
                close()
                assistant: ChatMsg = {"role": "assistant", "content": line.text}
                if line.tool_calls:
                    assistant["tool_calls"] = [
                        {
                            "id": c.call_id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": arguments_json(c.args)},
                        }
                        for c in line.tool_calls
                    ]
                open_group = [assistant]
            case EventKind.TOOL_OUTCOME:
                if open_group is None:  # a result without its call: shown as its own unit
                    open_group = []
                open_group.append(
                    {"role": "tool", "tool_call_id": line.call_id or "", "content": tool_content(line)}
                )
                results += 1
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
                continue  # not in the trace format (services/core/trace.py reads conversations only)
            case _:
                assert_never(kind)
    close()
    return History(tuple(system), tuple(task), tuple(units))


def with_system_prompt(lines: Sequence[TraceLine], prompt: str) -> list[TraceLine]:
    """``lines`` with ``prompt`` put before the trace's system text (a system line is added if none)."""
    out = list(lines)
    for i, line in enumerate(out):
        if line.kind == EventKind.SYSTEM:
            out[i] = replace(line, text=f"{prompt.rstrip()}\n\n{line.text}" if line.text else prompt)
            return out
    first = out[0] if out else None
    return [TraceLine(line=0, kind="system", text=prompt, run=first.run if first else None), *out]
