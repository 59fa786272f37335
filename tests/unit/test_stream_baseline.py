"""The pure decision: do the recorder's positions still describe the events stream?"""

from __future__ import annotations

from datetime import UTC, datetime

from services.core.baseline import (
    Positions,
    PositionReset,
    Rebaseline,
    StreamFacts,
    StreamVerdict,
    check_stream,
    plan_rebaseline,
    plan_truncation,
)

OLD = datetime(2026, 12, 1, 9, 0, 0, 123456, tzinfo=UTC)
NEW = datetime(2026, 12, 1, 10, 30, 0, 654321, tzinfo=UTC)


def stream(first: int = 1, last: int = 200, created: datetime = OLD) -> StreamFacts:
    return StreamFacts("CTX_EVENTS", first, last, created)


def test_check_stream_is_intact_when_identity_matches_and_no_position_is_ahead() -> None:
    positions = Positions({0: 120, 1: 200, 2: 0}, OLD)
    assert check_stream(positions, stream()) == StreamVerdict("intact", stream(), OLD, (), (200, 1))
    assert not check_stream(positions, stream()).halted


def test_check_stream_adopts_the_stream_on_a_fresh_database() -> None:
    verdict = check_stream(Positions({}, None), stream())
    assert verdict == StreamVerdict("adopt", stream(), None)
    assert not verdict.halted and verdict.reason is None


def test_check_stream_adopts_a_recreated_stream_when_nothing_was_ever_committed() -> None:
    # Positions of 0 read nothing: no event can be skipped, so the new identity is simply taken.
    verdict = check_stream(Positions({3: 0}, OLD), stream(created=NEW))
    assert verdict.kind == "adopt" and not verdict.halted


def test_check_stream_halts_when_a_position_is_ahead_of_a_stream_of_unknown_identity() -> None:
    s = stream(first=1, last=7)
    verdict = check_stream(Positions({1: 5, 3: 120, 2: 120}, None), s)
    assert verdict == StreamVerdict("went_backwards", s, None, (1, 2, 3), (120, 2))
    assert verdict.halted
    assert verdict.reason == (
        "events stream CTX_EVENTS went backwards: last seq 7 < committed position 120 of partition 2; "
        "nothing after it is being recorded; inspect, then run 'ctxfleet rebaseline'"
    )


def test_check_stream_halts_when_the_stream_was_recreated_even_with_every_position_behind_it() -> None:
    s = stream(last=500, created=NEW)
    verdict = check_stream(Positions({0: 40, 1: 12}, OLD), s)
    assert verdict.kind == "recreated" and verdict.halted and verdict.affected == (0, 1)
    assert verdict.reason == (
        f"events stream CTX_EVENTS was recreated at {NEW.isoformat()} (positions were read from the stream "
        f"created at {OLD.isoformat()}); nothing after it is being recorded; inspect, "
        "then run 'ctxfleet rebaseline'"
    )


def test_check_stream_reason_names_both_when_recreated_and_behind_a_position() -> None:
    reason = check_stream(Positions({3: 120}, OLD), stream(last=7, created=NEW)).reason
    assert reason is not None
    assert "was recreated at" in reason and "last seq 7 < committed position 120 of partition 3" in reason


def test_check_stream_adopts_positions_from_before_identities_when_none_is_ahead() -> None:
    verdict = check_stream(Positions({0: 150, 1: 199}, None), stream())
    assert verdict.kind == "adopt" and not verdict.halted


def test_check_stream_halts_positions_from_before_identities_when_one_is_ahead() -> None:
    verdict = check_stream(Positions({0: 150, 1: 260}, None), stream())
    assert verdict.kind == "went_backwards" and verdict.halted and verdict.ahead == (260, 1)


def test_plan_rebaseline_resets_every_committed_position_to_before_the_first_seq() -> None:
    s = stream(first=3, last=7, created=NEW)
    plan = plan_rebaseline(Positions({0: 0, 1: 5, 3: 120}, OLD), s)
    # Partition 1 is behind the last seq, but its 5 is a sequence of the old stream: reset too.
    assert plan.resets == (PositionReset(1, 5, 2), PositionReset(3, 120, 2))
    assert plan.needed


def test_plan_rebaseline_does_nothing_when_positions_match_the_stream() -> None:
    positions = Positions({0: 150}, OLD)
    assert plan_rebaseline(positions, stream()) == Rebaseline(check_stream(positions, stream()), ())
    assert not plan_rebaseline(positions, stream()).needed


def test_rebaselined_positions_check_intact_against_the_new_stream() -> None:
    s = stream(first=1, last=7, created=NEW)
    plan = plan_rebaseline(Positions({3: 120}, OLD), s)
    after = Positions({r.partition: r.new for r in plan.resets}, s.created)
    assert check_stream(after, s).kind == "intact"


def test_check_stream_repairs_a_lost_tail_of_the_same_stream_without_halting() -> None:
    # A broker killed before flushing what it acked: the same log, shorter.
    s = stream(first=1, last=1205)
    positions = Positions({0: 1180, 3: 1206, 5: 1210}, OLD)
    verdict = check_stream(positions, s)
    assert verdict == StreamVerdict("truncated", s, OLD, (3, 5), (1210, 5))
    assert not verdict.halted and verdict.reason is None
    # Only the partitions past the end move, and only down to it: the next publish is 1206.
    assert plan_truncation(positions, verdict) == (PositionReset(3, 1206, 1205), PositionReset(5, 1210, 1205))


def test_plan_truncation_changes_nothing_for_any_other_verdict() -> None:
    positions = Positions({0: 150}, OLD)
    assert plan_truncation(positions, check_stream(positions, stream())) == ()
