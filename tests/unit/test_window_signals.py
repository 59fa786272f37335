"""What a window's records say about closing it: phase boundaries, open calls, operations, low value."""

from __future__ import annotations

from contracts import PhaseChangeEvent, PhaseChangePayload
from services.core.windows.signals import low_value_share, open_calls, operations_of, phase_boundary
from tests.fixtures.builders import Thread, ledger_records


def _phase(t: Thread, phase: str, key: str, source: str = "runtime") -> PhaseChangeEvent:
    return PhaseChangeEvent(
        payload=PhaseChangePayload(phase=phase, source=source),  # type: ignore[arg-type]
        event_key=key,
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
    )


def test_phase_boundary_fires_on_a_runtime_change_after_work_in_the_window() -> None:
    t = Thread()
    records = ledger_records(
        [t.system(), t.user("fix it"), _phase(t, "discovery", "p1"), t.assistant("looking")]
    )
    changed = ledger_records(
        [
            t.system(),
            t.user("fix it"),
            _phase(t, "discovery", "p1"),
            t.assistant("looking"),
            _phase(t, "build", "p2"),
        ]
    )
    assert not phase_boundary(records, 0)
    assert phase_boundary(changed, 0)


def test_phase_boundary_ignores_a_model_proposal_a_repeat_and_a_change_before_any_work() -> None:
    t = Thread()
    proposal = ledger_records(
        [t.user("q"), t.assistant("a"), _phase(t, "build", "p", source="model_proposal")]
    )
    repeat = ledger_records(
        [t.user("q"), _phase(t, "build", "p1"), t.assistant("a"), _phase(t, "build", "p2")]
    )
    early = ledger_records([t.user("q"), t.assistant("a"), _phase(t, "build", "p3")])
    assert not phase_boundary(proposal, 0)
    assert not phase_boundary(repeat, 0)
    # The window that opened after the change (seq 3) has done no work in any other phase.
    assert not phase_boundary(early, 3)


def test_open_calls_and_operations_carry_unsettled_work() -> None:
    t = Thread()
    records = ledger_records(
        [t.user("q"), t.assistant(calls=(("a", "ls", {}), ("b", "cat", {}))), t.outcome("a", "x")]
    )
    assert open_calls(records) == ("b",)
    assert operations_of(records).active == ()


def test_low_value_share_counts_outputs_older_than_the_newest_two_groups() -> None:
    t = Thread()
    events = [t.user("q")]
    for n in range(4):
        events += [t.assistant(calls=((f"c{n}", "count", {}),)), t.outcome(f"c{n}", "row clear " * 50)]
    records = ledger_records(events)
    share = low_value_share(records)
    assert 0.4 < share < 0.6  # two of four large outputs are old
    assert low_value_share(records[:3]) == 0.0
