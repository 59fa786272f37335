"""The pollution probe and the state probe, computed from the trace itself. Pure.

Ground truth comes from the trace and the release catalog only: each successful outcome of a tool
with declared effects sets its paths (``services.core.state.effects_of`` fills the templates), in
trace order. It never reads the fleet's state projection, so a projection that stops superseding is
caught rather than trusted.

For each path that held a value before its current one, a context **lets a superseded value survive**
when it

1. marks a superseded value CURRENT on the path's state line, or
2. shows a superseded value anywhere — an old tool output, a summary line — without a state line
   that marks the current value CURRENT *and* names what it superseded. A bare "current value" with
   no supersession beside an old statement is two equal statements, which is exactly the failure.

A context that shows no superseded value at all passes, whatever else it shows. The **state probe**
asks whether the current value of every path is in the context at all.
"""

from __future__ import annotations

from contracts import EventKind

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from contracts import ToolCatalog

from services.core.evaluation.probes import message_texts
from services.core.state import effects_of, tool_spec
from services.core.trace import TraceCall, TraceLine

__all__ = [
    "StateProbe",
    "current_marker",
    "current_shown",
    "state_probes_at",
    "stale_survives",
    "text_of",
]

_SUPERSESSION = "; supersedes "


@dataclass(frozen=True, slots=True)
class StateProbe:
    """A path's current value after some trace lines, and every value it held before (oldest first)."""

    path: str
    current: JsonValue
    superseded: tuple[JsonValue, ...]


def state_probes_at(lines: Sequence[TraceLine], catalog: ToolCatalog | None) -> list[StateProbe]:
    """Every path the trace's tool effects set up to the end of ``lines``, ordered by path."""
    if catalog is None:
        return []
    calls: dict[str, TraceCall] = {}
    history: dict[str, list[JsonValue]] = {}
    for line in lines:
        if line.kind == EventKind.ASSISTANT_MESSAGE:
            calls.update((c.call_id, c) for c in line.tool_calls)
        elif line.kind == EventKind.TOOL_OUTCOME and line.status == "success":
            call = calls.get(line.call_id or "")
            spec = tool_spec(catalog, call.name) if call else None
            if call is None or spec is None:
                continue
            for op in effects_of(spec, call.args, line.status, line.text):
                if op.op == "set":
                    values = history.setdefault(op.path, [])
                    if not values or values[-1] != op.value:
                        values.append(op.value)
    return [
        StateProbe(path, values[-1], tuple(v for v in dict.fromkeys(values[:-1]) if v != values[-1]))
        for path, values in sorted(history.items())
    ]


def text_of(messages: Iterable[Mapping[str, JsonValue]]) -> str:
    """What a model reads in ``messages``, line structure kept: contents, then call arguments."""
    return "\n".join(message_texts(messages))


def current_marker(path: str, value: JsonValue) -> str:
    """How a state line marks ``value`` as the path's current one (``services.core.state.render_facts``)."""
    return f"- {path} = {json.dumps(value, ensure_ascii=False)} (CURRENT"


def current_shown(probe: StateProbe, text: str) -> bool:
    """Whether the path's current value is in the context at all."""
    return _shown(probe.current, text)


def stale_survives(probe: StateProbe, text: str) -> bool:
    """Whether ``text`` lets a superseded value of the path stand as current or as an equal (see above)."""
    if not probe.superseded:
        return False
    state_lines = [line for line in text.splitlines() if line.startswith(f"- {probe.path} = ")]
    if any(
        line.startswith(current_marker(probe.path, old)) for old in probe.superseded for line in state_lines
    ):
        return True
    if not any(_shown(old, text) for old in probe.superseded):
        return False
    marker = current_marker(probe.path, probe.current)
    return not any(line.startswith(marker) and _SUPERSESSION in line for line in state_lines)


def _shown(value: JsonValue, text: str) -> bool:
    needle = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return bool(needle) and needle in text
