"""The CLI's progress bar: drawn on a terminal's stderr only, never into a pipe or with --quiet."""

from __future__ import annotations

import io

from infra.cli_progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_and_shows_how_far_the_work_is() -> None:
    tty = _Terminal()
    with progress_bar("replaying t.jsonl", stream=tty) as advance:
        for done in range(1, 4):
            advance(done, 3)
    drawn = tty.getvalue()
    assert "replaying t.jsonl" in drawn and "3/3" in drawn


def test_progress_bar_draws_nothing_when_stderr_is_not_a_terminal() -> None:
    pipe = io.StringIO()
    with progress_bar("replaying t.jsonl", stream=pipe) as advance:
        advance(1, 3)
    assert pipe.getvalue() == ""


def test_progress_bar_draws_nothing_with_quiet_even_on_a_terminal() -> None:
    tty = _Terminal()
    with progress_bar("reindexing threads", quiet=True, stream=tty) as advance:
        advance(1, 3)
    assert tty.getvalue() == ""
