"""The state runtime over real NATS and Postgres: the only write path, authority, versions, projection."""

from __future__ import annotations

import asyncpg
import pytest

from contracts import (
    CompactionPolicy,
    ContextPolicy,
    PatchOp,
    PathRule,
    PreparedContext,
    PrepareRequest,
    StatePatchEvent,
    StatePatchPayload,
    ToolCatalog,
    ToolEffect,
    ToolSchema,
    ToolSpec,
)
from ctxfleet_client.client import FleetClient
from contracts.exceptions import EventRejected
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

CATALOG = ToolCatalog(
    release="warehouse@1",
    paths=(
        PathRule(pattern="item:{id}.location", kind="business_fact"),
        PathRule(pattern="item:{id}.moves", kind="tool_fact"),
        PathRule(pattern="task.goal", kind="goal"),
        PathRule(pattern="audit.actor", kind="audit"),
    ),
    tools=(
        ToolSpec(
            name="move_item",
            reads=("item:{id}.location",),
            effects=(
                ToolEffect(path="item:{args.item_id}.location", value="{result.location}"),
                ToolEffect(path="item:{args.item_id}.moves", op="increment", value="1"),
            ),
        ),
        ToolSpec(name="count_stock", reads=("item:{id}.moves",)),
    ),
)


def _patch(
    t: Thread, key: str, source: str, ops: list[PatchOp], based_on: dict[str, int] | None = None
) -> StatePatchEvent:
    payload = StatePatchPayload(source=source, ops=tuple(ops), based_on_version=based_on or {})  # type: ignore[arg-type]
    return StatePatchEvent(
        payload=payload, event_key=key, session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id
    )


async def _start(client: FleetClient, t: Thread, policy: str | None = None) -> None:
    await client.register_catalog(CATALOG)
    first = t.system("You run the warehouse.").model_copy(
        update={"agent_release": "warehouse@1", "policy": policy}
    )
    await client.append(first)


async def _prepare(
    client: FleetClient, t: Thread, after: str, budget: int = 50_000, tools: tuple[str, ...] = ()
) -> PreparedContext:
    return await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            budget_tokens=budget,
            after_event_key=after,
            tools=tuple(ToolSchema(name=n) for n in tools),
        )
    )


async def _move(client: FleetClient, t: Thread, n: int, location: str) -> str:
    await client.append(
        t.assistant(f"moving item 42 ({n})", calls=((f"m{n}", "move_item", {"item_id": 42, "to": location}),))
    )
    key = f"moved{n}"
    await client.append(t.outcome(f"m{n}", f'{{"location": "{location}", "ok": true}}', key=key))
    return key


async def test_pollution_current_fact_wins_even_when_an_old_summary_still_says_the_stale_value(
    start_fleet, client: FleetClient
) -> None:
    await start_fleet()
    await client.register_policy(
        ContextPolicy(
            name="tiny",
            model_profile=None,
            budget_tokens=1_500,
            compaction=CompactionPolicy(keep_recent_groups=1),
        )
    )
    t = Thread()
    await _start(client, t, policy="tiny")
    await client.append(t.user("Where is item 42 now?", key="task"))
    await _move(client, t, 10, "shelf_A")
    for n in range(11, 24):
        await client.append(
            t.assistant(
                "checking the aisle " + "and the shelves carefully " * 15,
                calls=((f"c{n}", "count_stock", {"item_id": 42}),),
            )
        )
        await client.append(t.outcome(f"c{n}", "aisle ok " * 20, key=f"stock{n}"))

    async def summarized() -> bool:
        try:
            return (await client.inspect(t.thread_id, limit=1)).summaries >= 1
        except Exception:
            return False

    await eventually(summarized, what="a compaction covering the first move")
    last = await _move(client, t, 30, "shelf_B")
    prepared = await _prepare(client, t, last, budget=1_500, tools=("move_item",))
    texts = [m.content or "" for m in prepared.messages]
    assert prepared.summary is not None  # the old move is summarized ...
    assert any(
        "shelf_A" in x for x in texts if x.startswith("[context summary")
    )  # ... and its summary says shelf_A
    state = texts[-1]
    assert state.startswith("[state: current facts")
    assert (
        f'- item:42.location = "shelf_B" (CURRENT, source {last}); supersedes "shelf_A" from moved10' in state
    )
    assert state.count("shelf_A") == 1 and "item:42.moves" not in state  # only the slice move_item reads


async def test_rejected_patches_change_nothing_and_say_why(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await _start(client, t)
    await client.append(
        _patch(t, "ok", "orchestrator", [PatchOp(op="set", path="item:7.location", value="dock")])
    )
    cases = [
        (
            "bad-path",
            "orchestrator",
            [PatchOp(op="set", path="item:7.colour", value="red")],
            {},
            "unregistered_path",
        ),
        (
            "bad-writer",
            "model_proposal",
            [PatchOp(op="set", path="item:7.location", value="roof")],
            {},
            "authority_violation",
        ),
        ("bad-audit", "user", [PatchOp(op="set", path="audit.actor", value="me")], {}, "authority_violation"),
        (
            "stale",
            "orchestrator",
            [PatchOp(op="set", path="item:7.location", value="x")],
            {"item:7": 0},
            "stale_state_version",
        ),
        (
            "bad-op",
            "orchestrator",
            [PatchOp(op="increment", path="item:7.location", value=1)],
            {},
            "invariant_violation",
        ),
    ]
    for key, source, ops, based_on, code in cases:
        await client.append(_patch(t, key, source, ops, based_on))
        with pytest.raises(EventRejected) as err:
            await _prepare(client, t, key)
        assert err.value.details["rejected_code"] == code
    rows = await db.fetch(
        "SELECT path, value, is_current FROM ctx.state_facts WHERE thread_id=$1", t.thread_id
    )
    assert [(r["path"], r["value"], r["is_current"]) for r in rows] == [("item:7.location", '"dock"', True)]
    assert await db.fetchval("SELECT version FROM ctx.state_versions WHERE thread_id=$1", t.thread_id) == 1


async def test_two_writers_on_different_aggregates_both_commit_and_on_the_same_base_one_is_refused(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await _start(client, t)
    await client.append(
        _patch(t, "a", "orchestrator", [PatchOp(op="set", path="item:1.location", value="a")], {"item:1": 0})
    )
    await client.append(
        _patch(t, "b", "orchestrator", [PatchOp(op="set", path="item:2.location", value="b")], {"item:2": 0})
    )
    await client.append(
        _patch(t, "c", "orchestrator", [PatchOp(op="set", path="item:1.location", value="c")], {"item:1": 0})
    )
    with pytest.raises(EventRejected) as err:
        await _prepare(client, t, "c")
    assert err.value.details["rejected_code"] == "stale_state_version"
    current = dict(
        await db.fetch(
            "SELECT path, value FROM ctx.state_facts WHERE thread_id=$1 AND is_current", t.thread_id
        )
    )
    assert current == {"item:1.location": '"a"', "item:2.location": '"b"'}


async def test_a_view_load_reads_the_facts_with_the_head_and_not_again_for_the_same_revision(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await _start(client, t)
    await client.append(
        _patch(t, "a", "orchestrator", [PatchOp(op="set", path="item:1.location", value="a")], {"item:1": 0})
    )
    await _prepare(client, t, "a")
    async with PgStore(fleet.pool).connection() as store:
        at_head = await store.thread_at_head(t.thread_id)
        assert at_head is not None and at_head.facts_read
        assert at_head.facts == (await store.read_states([t.thread_id]))[t.thread_id]
        assert at_head.facts is not None and at_head.facts.facts["item:1.location"].value == "a"
        held = await store.thread_at_head(t.thread_id, facts_of_revision=at_head.head.revision)
        assert held is not None and not held.facts_read and held.facts is None


async def test_tool_outcomes_update_state_through_declared_effects_and_failures_make_it_unknown(
    fleet, client: FleetClient
) -> None:
    t = Thread()
    await _start(client, t)
    await client.append(t.user("move item 42", key="task"))
    await _move(client, t, 1, "aisle_3")
    await client.append(t.assistant(calls=(("m2", "move_item", {"item_id": 42, "to": "dock"}),)))
    await client.append(t.outcome("m2", "gateway timeout", status="timeout", key="late"))
    state = await _prepare(client, t, "late")
    text = state.messages[-1].content or ""
    assert "- item:42.location = UNKNOWN (UNKNOWN, source late)" in text
    assert "item:42.moves" in text  # no tool requested: the whole (small) state is projected


async def test_model_proposals_are_recorded_apart_and_never_become_state(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await _start(client, t)
    await client.append(
        _patch(t, "p", "model_proposal", [PatchOp(op="set", path="task.goal", value="ship it")])
    )
    await client.append(t.user("hi", key="k"))
    prepared = await _prepare(client, t, "k")
    assert not any((m.content or "").startswith("[state:") for m in prepared.messages)
    assert await db.fetchval("SELECT count(*) FROM ctx.state_proposals WHERE thread_id=$1", t.thread_id) == 1
    assert await db.fetchval("SELECT count(*) FROM ctx.state_facts WHERE thread_id=$1", t.thread_id) == 0


async def test_receipts_track_side_effecting_calls_and_a_reused_operation_id_is_refused(
    fleet, client: FleetClient
) -> None:
    from contracts import OperationStatusRequest, ToolCall

    t = Thread()
    await client.append(t.user("refund order 7", key="q"))
    pay = t.assistant(calls=(("c1", "payments.refund", {"order": 7}),), key="a1")
    pay = pay.model_copy(
        update={
            "payload": pay.payload.model_copy(
                update={
                    "tool_calls": (
                        ToolCall(
                            call_id="c1",
                            name="payments.refund",
                            args={"order": 7},
                            operation_id="op-refund-7",
                        ),
                    )
                }
            )
        }
    )
    await client.append(pay)
    await _prepare(client, t, "q")
    status = OperationStatusRequest(session_id=t.session_id, operation_id="op-refund-7")

    async def requested() -> bool:
        try:
            return (await client.operation_status(status)).status == "requested"
        except Exception:
            return False

    await eventually(requested, what="the requested receipt")
    # A crash here: the runtime does not know whether the refund ran. It asks; the answer is "requested",
    # not "success" — an unknown result stays unknown until an outcome is recorded.
    outcome = t.outcome("c1", "refunded", key="o1").model_copy()
    outcome = outcome.model_copy(
        update={"payload": outcome.payload.model_copy(update={"external_ref": "rf_123"})}
    )
    await client.append(outcome)
    await _prepare(client, t, "o1")
    receipt = await client.operation_status(status)
    assert (receipt.status, receipt.external_ref, receipt.tool) == ("success", "rf_123", "payments.refund")
    again = t.assistant(key="a2")
    again = again.model_copy(
        update={
            "payload": again.payload.model_copy(
                update={
                    "tool_calls": (
                        ToolCall(
                            call_id="c2",
                            name="payments.refund",
                            args={"order": 7},
                            operation_id="op-refund-7",
                        ),
                    )
                }
            )
        }
    )
    await client.append(again)
    with pytest.raises(EventRejected) as err:
        await _prepare(client, t, "a2")
    assert err.value.details["rejected_code"] == "operation_exists"


async def test_state_equals_its_replay_from_the_ledger_and_a_tampered_projection_is_detected(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await _start(client, t)
    await client.append(t.user("move things", key="task"))
    await _move(client, t, 1, "aisle_3")
    await client.append(
        _patch(t, "goal", "user", [PatchOp(op="set", path="task.goal", value="tidy aisle 3")])
    )
    await _move(client, t, 2, "dock")
    await _prepare(client, t, "moved2")
    inspection = await client.inspect(t.thread_id)
    assert inspection.state_verified and inspection.state_facts == 3 and inspection.state_hash
    await db.execute(
        "UPDATE ctx.state_facts SET value = '\"roof\"' "
        "WHERE thread_id = $1 AND path = 'item:42.location' AND is_current",
        t.thread_id,
    )
    assert not (await client.inspect(t.thread_id)).state_verified


async def test_an_unknown_outcome_stays_unknown_until_the_orchestrator_reconciles_it(
    fleet, client: FleetClient
) -> None:
    from contracts import OperationReconcileEvent, OperationReconcilePayload, OperationStatusRequest, ToolCall

    t = Thread()
    await client.append(t.user("charge the card", key="q"))
    call = t.assistant(key="a")
    call = call.model_copy(
        update={
            "payload": call.payload.model_copy(
                update={
                    "tool_calls": (
                        ToolCall(call_id="c", name="charge", args={"eur": 20}, operation_id="op-charge"),
                    )
                }
            )
        }
    )
    await client.append(call)
    await client.append(t.outcome("c", "connection reset by peer", status="unknown", key="o"))
    await _prepare(client, t, "o")
    status = OperationStatusRequest(session_id=t.session_id, operation_id="op-charge")
    assert (await client.operation_status(status)).status == "unknown"
    settle = OperationReconcileEvent(
        payload=OperationReconcilePayload(
            operation_id="op-charge",
            status="success",
            external_ref="ch_9",
            evidence="PSP shows ch_9 captured",
        ),
        event_key="settle",
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id="main",
    )
    await client.append(settle)
    await _prepare(client, t, "settle")
    receipt = await client.operation_status(status)
    assert (receipt.status, receipt.external_ref, receipt.reconciled_event) == ("success", "ch_9", "settle")
    bogus = settle.model_copy(
        update={
            "event_key": "bogus",
            "payload": settle.payload.model_copy(update={"operation_id": "op-never"}),
        }
    )
    await client.append(bogus)
    with pytest.raises(EventRejected) as err:
        await _prepare(client, t, "bogus")
    assert err.value.details["rejected_code"] == "unknown_operation"


async def test_facts_keep_their_evidence_and_superseded_ones_say_until_when_they_held(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await _start(client, t)
    await client.append(t.user("move item 42", key="task"))
    await _move(client, t, 1, "aisle_3")
    await _move(client, t, 2, "dock")
    await _prepare(client, t, "moved2")
    rows = await db.fetch(
        "SELECT value, is_current, valid_to_seq, evidence, seq FROM ctx.state_facts "
        "WHERE thread_id=$1 AND path='item:42.location' ORDER BY seq",
        t.thread_id,
    )
    assert [(r["value"], r["is_current"]) for r in rows] == [('"aisle_3"', False), ('"dock"', True)]
    assert rows[0]["valid_to_seq"] == rows[1]["seq"] and rows[1]["valid_to_seq"] is None
    assert rows[1]["evidence"] == ["call:m2", "moved2"]
