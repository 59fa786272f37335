"""Synthetic traces: the builder the evaluation tests share, and the bench's 1,000-step thread."""

from __future__ import annotations

from pydantic import JsonValue

from services.core.evaluation.synthetic import SYNTHETIC_TASK, synthetic_trace
from services.core.trace import TraceCall, TraceLine


class TraceBuilder:
    """Appends trace lines with consecutive line numbers."""

    def __init__(self) -> None:
        self.lines: list[TraceLine] = []

    def _add(self, **fields: object) -> TraceBuilder:
        self.lines.append(TraceLine(line=len(self.lines) + 1, **fields))  # type: ignore[arg-type]
        return self

    def system(self, text: str) -> TraceBuilder:
        return self._add(kind="system", text=text)

    def user(self, text: str) -> TraceBuilder:
        return self._add(kind="user_input", text=text)

    def say(self, text: str) -> TraceBuilder:
        return self._add(kind="assistant_message", text=text)

    def call(self, text: str, *calls: tuple[str, str, dict[str, JsonValue]]) -> TraceBuilder:
        return self._add(
            kind="assistant_message", text=text, tool_calls=tuple(TraceCall(i, n, a) for i, n, a in calls)
        )

    def result(self, call_id: str, text: str, status: str = "success") -> TraceBuilder:
        return self._add(kind="tool_outcome", text=text, call_id=call_id, status=status)

    def bash(self, call_id: str, command: str, output: str, status: str = "success") -> TraceBuilder:
        return self.call(f"running {call_id}", (call_id, "bash", {"command": command})).result(
            call_id, output, status
        )


def test_synthetic_trace_is_the_same_every_time_and_has_every_call_answered() -> None:
    first, second = synthetic_trace(200), synthetic_trace(200)
    assert first == second
    calls = [c.call_id for line in first for c in line.tool_calls]
    results = [line.call_id for line in first if line.kind == "tool_outcome"]
    assert len(calls) == 200 and calls == results
    assert [line.line for line in first] == list(range(1, len(first) + 1))
    assert first[1].kind == "user_input" and first[1].text == SYNTHETIC_TASK


def test_synthetic_trace_fails_tests_and_later_passes_them() -> None:
    statuses = [line.status for line in synthetic_trace(48) if line.kind == "tool_outcome"]
    assert "error" in statuses and statuses.count("success") > statuses.count("error")
