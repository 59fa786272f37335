"""``python -m tests.under_load``: run timing-sensitive tests repeatedly while every core is busy.

A user's laptop and a shared CI runner are busy machines. The tests listed in ``TIMING_SENSITIVE``
start processes, kill them, race two writers or drain a server — the places where a wait on a
fixed time instead of a condition shows up only when the CPU is taken. This runs them ``--count``
times in a row (pytest-repeat) beside one CPU hog per core and exits with pytest's status.

The hogs are plain busy loops in processes of their own, at the same priority as the tests, and
each stops by itself after ``--hog-seconds`` even if this process is killed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["TIMING_SENSITIVE", "main"]

ROOT = Path(__file__).resolve().parents[1]

# Each waits on another process, a restart or a race; each has failed on a loaded machine before.
TIMING_SENSITIVE: tuple[str, ...] = (
    "tests/e2e/test_data_folder.py::test_ctrl_c_during_the_startup_replay_stops_the_fleet_cleanly",
    "tests/e2e/test_data_folder.py::test_a_failing_startup_replay_is_reported_in_one_line_and_the_fleet_keeps_serving",
    "tests/e2e/test_data_folder.py::test_up_restarts_a_killed_embedded_server_and_is_ready_again",
    "tests/integration/test_compaction.py::test_two_compactors_racing_on_one_thread_commit_exactly_one_summary",
    "tests/integration/test_compaction.py::test_user_message_arriving_while_a_compaction_commits_is_kept_after_the_summary",
    "tests/integration/test_responder_serving.py::test_a_drain_answers_every_request_delivered_and_takes_no_more",
)


def _hog(deadline: float) -> None:
    """Spin until ``deadline`` (monotonic): one core's worth of work that yields to nobody."""
    x = 0
    while time.monotonic() < deadline:
        for _ in range(100_000):
            x = (x * 31 + 7) % 1_000_003


def main(argv: Sequence[str] | None = None) -> int:
    """Start the hogs, run the tests ``--count`` times each, stop the hogs, return pytest's status."""
    p = argparse.ArgumentParser(prog="python -m tests.under_load", description=__doc__)
    p.add_argument("--count", type=int, default=20, help="runs of each test in a row (default 20)")
    p.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes (default: cores)")
    p.add_argument("--hog-seconds", type=float, default=3_600, help="each hog stops by itself after this")
    p.add_argument("tests", nargs="*", help="test ids (default: the timing-sensitive list)")
    args = p.parse_args(argv)
    deadline = time.monotonic() + args.hog_seconds
    context = multiprocessing.get_context("spawn")
    hogs = [context.Process(target=_hog, args=(deadline,), daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    print(f"under load: {args.hogs} busy processes, each test {args.count} times", flush=True)
    try:
        command = [
            sys.executable,
            "-m",
            "pytest",
            f"--count={args.count}",
            "--repeat-scope=function",
            "-x",
            "-q",
            *(args.tests or TIMING_SENSITIVE),
        ]
        return subprocess.call(command, cwd=ROOT)
    finally:
        for hog in hogs:
            hog.terminate()
        for hog in hogs:
            hog.join(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
