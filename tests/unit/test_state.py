"""State: registered paths, authority, versions, invariants, supersession, tool effects. No I/O."""

from __future__ import annotations

import pytest

from contracts import PatchOp, PathRule, ToolEffect, ToolSpec
from contracts.exceptions import AuthorityViolation, InvariantViolation, StaleStateVersion, UnregisteredPath
from services.core.state import StateView, effects_of, plan_patch, render_facts, state_hash

RULES = (
    PathRule(pattern="item:{id}.location", kind="business_fact"),
    PathRule(pattern="item:{id}.moves", kind="tool_fact"),
    PathRule(pattern="task.goal", kind="goal"),
    PathRule(pattern="task.plan", kind="plan"),
    PathRule(pattern="audit.last_actor", kind="audit"),
)
MOVE = ToolSpec(
    name="move_item",
    reads=("item:{id}.location",),
    effects=(
        ToolEffect(path="item:{args.item_id}.location", value="{result.location}"),
        ToolEffect(path="item:{args.item_id}.moves", op="increment", value="1"),
    ),
)


def _patch(
    state: StateView,
    ops: list[PatchOp],
    source: str = "orchestrator",
    key: str = "e1",
    seq: int = 1,
    based_on=None,
    at=None,
):  # type: ignore[no-untyped-def]
    write = plan_patch(
        state,
        ops,
        source=source,
        based_on=based_on or {},
        rules=RULES,
        event_key=key,
        seq=seq,
        observed_at=at,
    )
    state.apply(write)
    return write


def test_pollution_newer_fact_supersedes_and_renders_as_the_only_current_value() -> None:
    state = StateView()
    _patch(state, [PatchOp(op="set", path="item:42.location", value="shelf_A")], key="event_10", seq=10)
    _patch(state, [PatchOp(op="set", path="item:42.location", value="shelf_B")], key="event_30", seq=30)
    fact = state.facts["item:42.location"]
    assert (fact.value, fact.status, fact.event_key, fact.supersedes) == (
        "shelf_B",
        "known",
        "event_30",
        "event_10",
    )
    block = render_facts(state.facts.values())
    assert (
        '- item:42.location = "shelf_B" (CURRENT, source event_30); supersedes "shelf_A" from event_10'
        in block
    )
    assert block.count("shelf_A") == 1  # only as what was superseded, never as an equal


def test_unregistered_path_wrong_authority_stale_version_and_broken_invariant_are_refused() -> None:
    state = StateView()
    with pytest.raises(UnregisteredPath):
        _patch(state, [PatchOp(op="set", path="secret.flag", value=1)])
    with pytest.raises(AuthorityViolation):
        _patch(state, [PatchOp(op="set", path="item:1.location", value="x")], source="model_proposal")
    with pytest.raises(AuthorityViolation):
        _patch(state, [PatchOp(op="set", path="audit.last_actor", value="me")], source="user")
    _patch(state, [PatchOp(op="set", path="item:1.location", value="a")])
    with pytest.raises(StaleStateVersion):
        _patch(state, [PatchOp(op="set", path="item:1.location", value="b")], based_on={"item:1": 0})
    with pytest.raises(InvariantViolation):
        _patch(state, [PatchOp(op="increment", path="item:1.location", value=1)])
    with pytest.raises(InvariantViolation):
        _patch(state, [PatchOp(op="replace_if", path="item:1.location", value="c", expected="zzz")])
    assert state.facts["item:1.location"].value == "a" and state.versions == {"item:1": 1}


def test_model_proposals_are_recorded_but_never_applied() -> None:
    state = StateView()
    write = _patch(state, [PatchOp(op="set", path="task.goal", value="ship v2")], source="model_proposal")
    assert write.proposal and state.facts == {}
    _patch(state, [PatchOp(op="set", path="task.plan", value=["read", "fix"])], source="model_proposal")
    assert state.facts["task.plan"].value == ["read", "fix"]  # plans are the model's to write


def test_writers_on_different_aggregates_do_not_contend_and_same_base_on_one_conflicts() -> None:
    state = StateView()
    _patch(state, [PatchOp(op="set", path="item:1.location", value="a")], based_on={"item:1": 0})
    _patch(state, [PatchOp(op="set", path="item:2.location", value="b")], based_on={"item:2": 0})
    with pytest.raises(StaleStateVersion):
        _patch(state, [PatchOp(op="set", path="item:1.location", value="c")], based_on={"item:1": 0})


def test_equal_rank_write_observed_earlier_marks_the_key_conflicted_not_last_write_wins() -> None:
    state = StateView()
    _patch(
        state, [PatchOp(op="set", path="item:5.location", value="dock")], key="e1", at="2026-11-30T10:00:00"
    )
    _patch(
        state,
        [PatchOp(op="set", path="item:5.location", value="shelf")],
        key="e2",
        seq=2,
        at="2026-11-30T09:00:00",
    )
    fact = state.facts["item:5.location"]
    assert (fact.status, fact.value, fact.superseded_value) == ("conflicted", "dock", "shelf")
    assert "CONFLICTED" in render_facts(state.facts.values())


def test_tool_effects_write_state_from_the_result_and_unknown_on_failure() -> None:
    ok = effects_of(MOVE, {"item_id": 42}, "success", '{"location": "shelf_B"}')
    assert [(o.op, o.path, o.value) for o in ok] == [
        ("set", "item:42.location", "shelf_B"),
        ("increment", "item:42.moves", 1),
    ]
    failed = effects_of(MOVE, {"item_id": 42}, "timeout", "gateway timeout")
    assert all(o.unknown and o.op == "set" for o in failed)
    assert effects_of(MOVE, {}, "success", '{"location": "x"}') == []  # no item id: nothing is guessed
    state = StateView()
    _patch(state, failed, source="tool_effect")
    assert "item:42.location = UNKNOWN (UNKNOWN, source e1)" in render_facts(state.facts.values())


def test_replaying_the_same_writes_gives_the_same_state_hash() -> None:
    def build() -> StateView:
        state = StateView()
        _patch(state, [PatchOp(op="set", path="item:1.location", value="a")], key="e1", seq=1)
        _patch(state, [PatchOp(op="append", path="task.plan", value="step")], key="e2", seq=2, source="user")
        _patch(state, [PatchOp(op="set", path="item:1.location", value="b")], key="e3", seq=3)
        return state

    assert state_hash(build()) == state_hash(build())
    other = build()
    _patch(other, [PatchOp(op="clear", path="item:1.location")], key="e4", seq=4)
    assert state_hash(other) != state_hash(build())


PLAN_RULES = RULES + (
    PathRule(pattern="plan:{id}.status", kind="plan"),
    PathRule(pattern="plan:{id}.steps", kind="plan"),
    PathRule(pattern="constraint:{id}.text", kind="constraint"),
)


def test_plan_moves_only_along_its_lifecycle_based_on_a_state_version() -> None:
    state = StateView()

    def status(value: str, based_on: dict[str, int] | None = None, key: str = "e") -> None:
        write = plan_patch(
            state,
            [PatchOp(op="set", path="plan:1.status", value=value)],
            source="orchestrator",
            based_on=based_on or {},
            rules=PLAN_RULES,
            event_key=key,
            seq=1,
            observed_at=None,
        )
        state.apply(write)

    with pytest.raises(InvariantViolation, match="from nothing to 'executing'"):
        status("executing")
    status("proposed")
    status("accepted", based_on={"plan:1": 1})
    with pytest.raises(StaleStateVersion):
        status("executing", based_on={"plan:1": 1})  # someone else moved the plan meanwhile
    status("executing", based_on={"plan:1": 2})
    status("blocked")
    status("executing")
    status("completed")
    with pytest.raises(InvariantViolation, match="from completed"):
        status("executing")


def test_constraints_keep_the_users_words_and_a_model_can_only_propose_one() -> None:
    state = StateView()
    user = plan_patch(
        state,
        [PatchOp(op="set", path="constraint:c1.text", value="Never change the public API.")],
        source="user",
        based_on={},
        rules=PLAN_RULES,
        event_key="u1",
        seq=1,
        observed_at=None,
    )
    state.apply(user)
    model = plan_patch(
        state,
        [PatchOp(op="set", path="constraint:c1.text", value="APIs may change.")],
        source="model_proposal",
        based_on={},
        rules=PLAN_RULES,
        event_key="m1",
        seq=2,
        observed_at=None,
    )
    state.apply(model)
    assert model.proposal and state.facts["constraint:c1.text"].value == "Never change the public API."


def test_stale_keeps_the_value_but_says_it_may_no_longer_hold_and_evidence_is_kept() -> None:
    state = StateView()
    state.apply(
        plan_patch(
            state,
            [PatchOp(op="set", path="item:3.location", value="bay_1")],
            source="orchestrator",
            based_on={},
            rules=RULES,
            event_key="e1",
            seq=1,
            observed_at=None,
            evidence=("scan-991",),
        )
    )
    assert state.facts["item:3.location"].evidence == ("scan-991",)
    state.apply(
        plan_patch(
            state,
            [PatchOp(op="set", path="item:3.location", stale=True)],
            source="orchestrator",
            based_on={},
            rules=RULES,
            event_key="e2",
            seq=2,
            observed_at=None,
        )
    )
    fact = state.facts["item:3.location"]
    assert (fact.value, fact.status) == ("bay_1", "stale")
    assert "may no longer hold" in render_facts(state.facts.values())
    with pytest.raises(InvariantViolation, match="only a recorded fact"):
        plan_patch(
            state,
            [PatchOp(op="set", path="item:4.location", stale=True)],
            source="orchestrator",
            based_on={},
            rules=RULES,
            event_key="e3",
            seq=3,
            observed_at=None,
        )
