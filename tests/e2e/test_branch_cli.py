"""`ctxfleet export` and `ctxfleet fork` as a user runs them, against `ctxfleet up` in another process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from services.core.trace import read_trace
from tests.e2e.test_replay_cli import SAMPLE, _ctxfleet

pytestmark = [pytest.mark.pg, pytest.mark.nats]


def _export_when_recorded(session: str, out: Path, lines: int, env: dict[str, str]) -> None:
    # replay returns once it has published; its last event may still be on its way to the ledger.
    deadline = time.monotonic() + 20
    while True:
        result = _ctxfleet("export", session, "--out", str(out), env=env)
        assert result.returncode == 0, result.stderr
        if len(read_trace(out)) >= lines or time.monotonic() > deadline:
            return


def test_export_replays_back_and_fork_branches_a_session_from_the_command_line(
    serving_fleet: dict[str, str], tmp_path: Path
) -> None:
    env = serving_fleet
    report = tmp_path / "r.json"
    assert _ctxfleet("replay", str(SAMPLE), "--report", str(report), env=env).returncode == 0
    session = json.loads(report.read_text())["totals"]["session_id"]
    exported = tmp_path / "export.jsonl"
    _export_when_recorded(session, exported, len(read_trace(SAMPLE)), env)
    assert [(line.kind, line.text) for line in read_trace(exported)] == [
        (line.kind, line.text) for line in read_trace(SAMPLE)
    ]
    assert not (tmp_path / "export.jsonl.partial").exists()
    again = tmp_path / "again.json"
    replayed = _ctxfleet("replay", str(exported), "--report", str(again), env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(again.read_text())["totals"]["errors"] == 0

    fork = _ctxfleet("fork", session, "--at", "2", "--as", f"{session}-f", "--json", env=env)
    assert fork.returncode == 0, fork.stderr
    forked = json.loads(fork.stdout)
    assert (forked["parent_session_id"], forked["at_seq"], forked["next_seq"]) == (session, 2, 3)
    history = _ctxfleet("export", forked["session_id"], env=env)
    assert history.returncode == 0, history.stderr
    assert history.stdout.splitlines() == exported.read_text().splitlines()[:2]
    human = _ctxfleet("fork", session, "--at", "2", "--as", f"{session}-f", env=env)
    assert "(it already existed)" in human.stdout


def test_export_and_fork_of_a_missing_session_fail_in_one_line_with_exit_code_2(
    serving_fleet: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "never.jsonl"
    for args in (("export", "no-such-session", "--out", str(out)), ("fork", "no-such-session", "--at", "1")):
        result = _ctxfleet(*args, env=serving_fleet)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [
            "ctxfleet: thread_not_found: thread session no-such-session has no recorded events"
        ]
    assert not out.exists() and not (tmp_path / "never.jsonl.partial").exists()
