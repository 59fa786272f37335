"""The lines that close ``ctxfleet up``'s startup replay: what happened, and what to open next."""

from __future__ import annotations

import shlex
from pathlib import Path

from infra.startup_replay import COMPACTION_WAIT_S, StartupReplay, closing_lines, context_command


def _replay(**changes: object) -> StartupReplay:
    figures: dict[str, object] = {
        "trace": "sample.jsonl",
        "thread_id": "replay-1-r1.main",
        "budget": 8000,
        "events": 98,
        "prepares": 48,
        "failed": 0,
        "latency_ms_p50": 8.4,
        "compactions": 2,
        "history_tokens": 16_080,
        "context_tokens": 5_414,
    }
    return StartupReplay(**{**figures, **changes})  # type: ignore[arg-type]


def test_closing_lines_say_what_happened_then_the_thread_and_where_to_look() -> None:
    lines = closing_lines(_replay(), context="CMD", console="CONSOLE", metrics="METRICS")
    assert lines == [
        "replayed sample.jsonl at a budget of 8,000 tokens:",
        "  98 events, 48 prepares (p50 8 ms), 2 compactions: "
        "context 16,080 → 5,414 tokens (whole history → last prepare)",
        "  thread   replay-1-r1.main",
        "  context  CMD",
        "  console  CONSOLE",
        "  metrics  METRICS",
    ]


def test_closing_lines_say_when_no_compaction_committed_in_time_although_the_history_overran() -> None:
    lines = closing_lines(_replay(compactions=0), context="", console="", metrics="")
    assert f"0 compactions (none committed within {COMPACTION_WAIT_S:.0f} s)" in lines[1]


def test_closing_lines_count_failed_prepares_and_omit_the_context_figures_without_one() -> None:
    line = closing_lines(
        _replay(failed=48, context_tokens=None, history_tokens=100, compactions=0),
        context="",
        console="",
        metrics="",
    )[1]
    assert line == "  98 events, 48 prepares (p50 8 ms, 48 failed), 0 compactions"


def test_context_command_names_the_budget_and_only_what_a_second_terminal_lacks() -> None:
    assert (
        context_command("r-1.main", 8000, tenant="default", data_dir=None)
        == ".venv/bin/ctxfleet context r-1.main --budget 8000"
    )
    folder = Path("/tmp/a folder")
    line = context_command("r-1.main", 8000, tenant="acme", data_dir=folder)
    assert shlex.split(line) == [
        f"CTX_DATA_DIR={folder}",
        ".venv/bin/ctxfleet",
        "--tenant",
        "acme",
        "context",
        "r-1.main",
        "--budget",
        "8000",
    ]
