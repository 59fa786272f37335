"""Trace reading and the pure parts of replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts import AssistantMessageEvent, ToolOutcomeEvent
from contracts.task_budgets import CallUsage
from services.app.exporting import trace_line
from services.store.branches import HistoryRow
from infra import SAMPLES_DIR
from services.edge.replay import ReplayOptions, full_history_tokens, percentile, trace_events
from services.settings import Settings, parse_partitions
from services.core.trace import TraceFormatError, read_trace


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    return path


def test_read_trace_reads_every_bundled_sample() -> None:
    samples = sorted(SAMPLES_DIR.glob("*.jsonl"))
    assert samples
    for sample in samples:
        lines = read_trace(sample)
        assert lines[0].kind == "system" and any(line.kind == "assistant_message" for line in lines)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"kind": "user_input", "text": "ok"}\nnot json\n', "t.jsonl:2: not JSON"),
        ('{"kind": "thought", "text": "x"}\n', "unknown kind"),
        ('{"kind": "tool_outcome", "text": "x"}\n', "needs a call_id"),
        ('{"kind": "tool_outcome", "call_id": "c", "status": "meh"}\n', "unknown status"),
        ('{"kind": "assistant_message", "tool_calls": [{"name": "x"}]}\n', "call_id and name"),
        ('{"kind": "assistant_message", "usage": {"input_tokens": -1, "output_tokens": 2}}\n', "usage:"),
        ('{"kind": "user_input", "usage": {"input_tokens": 1, "output_tokens": 2}}\n', "assistant_message"),
    ],
)
def test_read_trace_reports_the_line_and_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        read_trace(_write(tmp_path, text))


def test_trace_events_start_a_new_run_per_run_value_and_use_stable_keys(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '{"kind": "system", "text": "s"}\n'
        '{"kind": "assistant_message", "text": "", "tool_calls": [{"call_id": "c1", "name": "ls", "args": '
        '{"a": 1}}]}\n'
        '{"kind": "tool_outcome", "call_id": "c1", "status": "timeout", "text": "..."}\n'
        '{"kind": "user_input", "text": "next", "run": "second"}\n',
    )
    events = trace_events(read_trace(path), ReplayOptions(session_id="sess"))
    assert [e.event_key for e in events] == ["e000001", "e000002", "e000003", "end-sess-r1", "e000004"]
    assert [e.run_id for e in events] == ["sess-r1", "sess-r1", "sess-r1", "sess-r1", "sess-r2"]
    assert events[3].kind == "run_status" and events[3].payload.status == "completed"  # type: ignore[union-attr]
    assert isinstance(events[1], AssistantMessageEvent) and events[1].payload.tool_calls[0].args == {"a": 1}
    assert events[4].kind == "user_input"
    assert isinstance(events[2], ToolOutcomeEvent) and events[2].payload.status.value == "timeout"


def test_full_history_tokens_count_the_untrimmed_event_with_its_envelope(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"kind": "user_input", "text": "hello world"}\n')
    (event,) = trace_events(read_trace(path), ReplayOptions(session_id="s"))
    assert full_history_tokens(event) == 2 + 4


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([], 50) == 0.0 and percentile([7.0], 99) == 7.0


def test_parse_partitions_accepts_ranges_lists_and_replica_shares() -> None:
    assert parse_partitions("all", 4) == (0, 1, 2, 3)
    assert parse_partitions("0-2,5", 8) == (0, 1, 2, 5)
    assert parse_partitions("1/3", 8) == (1, 4, 7)
    for bad in ("9", "3/3", "x"):
        with pytest.raises(ValueError):
            parse_partitions(bad, 8)


def test_settings_read_ctx_environment_and_refuse_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_PARTITIONS", "32")
    monkeypatch.setenv("CTX_WORKERS", "recorder")
    s = Settings()
    assert s.bus.partitions == 32 and s.process.worker_names == ("recorder",)
    monkeypatch.setenv("CTX_WORKERS", "recorder,telepath")
    with pytest.raises(ValueError, match="telepath"):
        Settings()
    monkeypatch.setenv("CTX_WORKERS", "assembler")
    monkeypatch.setenv("CTX_PARTITIONS", "0")
    with pytest.raises(ValueError):
        Settings()


def test_reported_usage_goes_from_a_trace_line_to_the_event_and_back_into_an_export(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        '{"kind": "assistant_message", "text": "hi", "usage": {"input_tokens": 900, "output_tokens": 12, '
        '"cost": 0.002}}\n{"kind": "assistant_message", "text": "bye"}\n',
    )
    lines = read_trace(path)
    events = trace_events(lines, ReplayOptions(session_id="sess"))
    first, second = events[0], events[1]
    assert isinstance(first, AssistantMessageEvent) and isinstance(second, AssistantMessageEvent)
    assert first.payload.usage == CallUsage(input_tokens=900, output_tokens=12, cost=0.002)
    assert second.payload.usage is None

    stored = first.payload.model_dump(mode="json", exclude={"text"})
    row = HistoryRow(1, "sess-r1.main", "sess-r1", "assistant_message", stored, "hi", None)
    exported = json.loads(trace_line("sess", row) or "")
    assert exported["usage"] == {"input_tokens": 900, "output_tokens": 12, "cost": 0.002}
    plain = HistoryRow(2, "sess-r1.main", "sess-r1", "assistant_message", {"tool_calls": []}, "bye", None)
    assert "usage" not in json.loads(trace_line("sess", plain) or "")
