"""Who may fork and export (the NATS grants), and the CLI's refusals before it looks for a fleet."""

from __future__ import annotations

import pytest

from infra.cli import main
from infra.nats_accounts import OPERATOR, grants
from services.app.forking import open_calls
from services.store.branches import HistoryRow
from tests.unit.test_nats_grants import _matches


def _may_publish(user: str, subject: str) -> bool:
    return any(_matches(p, subject) for p in grants(("acme", "globex"))[user].publish)


def _may_serve(subject: str) -> bool:
    return any(_matches(p, subject) for p in grants(("acme",))["assembler"].subscribe)


def test_a_runtime_may_fork_its_own_tenants_sessions_but_only_an_operator_may_export_one() -> None:
    assert _may_publish("runtime-acme", "ctx.session.fork.acme")
    assert not _may_publish("runtime-acme", "ctx.session.fork.globex")
    assert not _may_publish("runtime-acme", "ctx.session.export.acme.s1")
    assert _may_publish(OPERATOR, "ctx.session.fork.globex")
    assert _may_publish(OPERATOR, "ctx.session.export.globex.s1")
    assert _may_serve("ctx.session.fork.acme") and _may_serve("ctx.session.export.acme.s1")


def _row(seq: int, kind: str, **payload: object) -> HistoryRow:
    return HistoryRow(seq, "r1.main", "r1", kind, dict(payload), "", None)


def test_open_calls_are_the_calls_without_an_outcome_in_order() -> None:
    rows = [
        _row(1, "user_input"),
        _row(2, "assistant_message", tool_calls=[{"call_id": "c1"}, {"call_id": "c2"}]),
        _row(3, "tool_outcome", call_id="c2"),
        _row(4, "assistant_message", tool_calls=[{"call_id": "c3"}]),
    ]
    assert open_calls(rows) == ["c1", "c3"]
    assert (
        open_calls([*rows, _row(5, "tool_outcome", call_id="c1"), _row(6, "tool_outcome", call_id="c3")])
        == []
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fork", "s1", "--at", "0"], "bad fork: at_seq: Input should be greater than or equal to 1"),
        (["fork", "s1", "--at", "3", "--as", "bad.id"], "bad fork: new_session_id: String should match"),
    ],
)
def test_fork_with_a_bad_point_or_id_is_refused_with_the_reason_and_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
