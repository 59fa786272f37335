"""Every ``ctxfleet`` failure a person meets is one line on stderr and exit code 2, never a traceback.

One test per class of error — bad arguments, a missing file, no fleet found, a fleet that refuses the
connection — across the subcommands it can happen to. No server is started: a refused connection is
a closed local port.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.cli import _parser, main

# The subcommands, from the parser itself: a new one is covered by the bad-argument test at once.
SUBCOMMANDS = sorted(_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
# A port nothing listens on: connecting is refused at once.
REFUSED = "nats://127.0.0.1:1"


@pytest.fixture(autouse=True)
def no_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No configured servers and an empty data folder: nothing to find."""
    for name in list(os.environ):
        if name.startswith("CTX_"):
            monkeypatch.delenv(name)
    data = tmp_path / "data"
    monkeypatch.setenv("CTX_DATA_DIR", str(data))
    return data


def _one_line_failure(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv, out, err)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err and "usage:" not in err
    return err


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_cli_bad_option_of_any_subcommand_is_one_line_naming_it(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _one_line_failure([command, "--no-such-option"], capsys)
    # Either the option is named, or the missing argument argparse stopped at first.
    assert err.startswith("ctxfleet") and "--help" in err
    assert "--no-such-option" in err or "required" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["no-such-command"], "invalid choice: 'no-such-command'"),
        (["replay"], "the following arguments are required: file"),
        (["inspect", "r1.main", "--limit", "many"], "invalid int value: 'many'"),
        (["context", "r1.main", "--profile", "p.json", "--model-profile", "gpt-4o"], "not allowed with"),
        (["compact"], "the following arguments are required: thread"),
    ],
)
def test_cli_bad_arguments_are_one_line_with_the_reason(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert says in _one_line_failure(argv, capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["context", "r1", "--budget", "100"],
        ["compact", "not a thread"],
        ["context", "r1.main", "--budget", "0"],
    ],
)
def test_cli_bad_thread_or_budget_is_refused_before_looking_for_a_fleet(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "no running fleet" not in _one_line_failure(argv, capsys)


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "{missing}"],
        ["eval", "{missing}"],
        ["context", "--file", "{missing}"],
        ["context", "r1.main", "--profile", "{missing}"],
    ],
)
def test_cli_missing_file_is_one_line_naming_it(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "missing.jsonl")
    err = _one_line_failure([a.replace("{missing}", missing) for a in argv], capsys)
    assert err == f"ctxfleet: No such file or directory: {missing}\n"


def test_cli_context_file_that_is_not_a_prepared_context_names_the_first_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dumped = tmp_path / "0001.json"
    dumped.write_text('{"type": "prepared_context"}')
    err = _one_line_failure(["context", "--file", str(dumped)], capsys)
    assert err.startswith(f"ctxfleet: {dumped} is not a valid PreparedContext: Field required")


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "infra/samples/{sample}"],
        ["inspect", "r1.main"],
        ["inspect", "--session", "s1"],
        ["search", "s1", "import"],
        ["context", "r1.main"],
        ["compact", "r1.main"],
        ["env"],
        ["provision"],
        ["reindex"],
        ["migrate"],
        ["rebaseline"],
        ["worker", "recorder"],
    ],
)
def test_cli_without_a_running_fleet_says_how_to_start_one(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    sample = next(Path("infra/samples").glob("*.jsonl")).name
    err = _one_line_failure([a.replace("{sample}", sample) for a in argv], capsys)
    assert "make run" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "r1.main"],
        ["inspect", "--session", "s1"],
        ["search", "s1", "import"],
        ["context", "r1.main"],
        ["compact", "r1.main"],
        ["provision"],
    ],
)
def test_cli_when_nats_refuses_the_connection_is_one_line_fleet_unavailable(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTX_NATS_URL", REFUSED)
    err = _one_line_failure(argv, capsys)
    assert "127.0.0.1:1" in err


def _entry_point(argv: list[str], data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *argv],
        capture_output=True,
        text=True,
        env=clean | {"CTX_DATA_DIR": str(data)} | env,
        timeout=60,
        check=False,
    )


def test_cli_replay_of_a_missing_file_through_the_real_entry_point_prints_no_traceback(
    tmp_path: Path, no_fleet: Path
) -> None:
    missing = tmp_path / "missing.jsonl"
    done = _entry_point(["replay", str(missing)], no_fleet)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"ctxfleet: No such file or directory: {missing}\n"


@pytest.mark.parametrize("argv", [["provision"], ["inspect", "r1.main"]])
def test_cli_refused_connection_through_the_real_entry_point_logs_no_driver_traceback(
    argv: list[str], no_fleet: Path
) -> None:
    # The driver's own logger (not our output) printed a traceback per connect attempt.
    done = _entry_point(argv, no_fleet, CTX_NATS_URL=REFUSED)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "ctxfleet: fleet_unavailable: cannot connect to NATS at nats://127.0.0.1:1: "
        "nats: no servers available for connection\n"
    )
