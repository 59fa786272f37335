"""`ctxfleet search` refuses a bad scope before it looks for a fleet."""

from __future__ import annotations

import pytest

from infra.cli import main


def test_search_with_a_backwards_time_range_is_refused_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["search", "s1", "x", "--since", "2026-12-01T00:00:00Z", "--until", "2026-11-01T00:00:00Z"]) == 2
    )
    assert "bad search: Value error, until must be after since" in capsys.readouterr().err


def test_search_with_an_unreadable_time_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "s1", "x", "--since", "yesterday"]) == 2
    err = capsys.readouterr().err
    assert "bad search:" in err and "(since)" in err
