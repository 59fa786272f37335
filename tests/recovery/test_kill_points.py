"""The kill-point matrix: SIGKILL the fleet at each point, restart, check everything (docs/design.md,
"Recovery is checked at every kill point").

For every point: the run recovers; no event is lost or recorded twice; no side effect is repeated
(one receipt per operation, never re-requested); state equals its replay from the ledger; the hash
chain holds; and the next prepared context is rebuilt correctly.
"""

from __future__ import annotations

import signal
from pathlib import Path

import asyncpg
import pytest

from contracts import (
    CompactionPolicy,
    ContextPolicy,
    OperationStatusRequest,
    PatchOp,
    PathRule,
    PrepareRequest,
    StatePatchEvent,
    StatePatchPayload,
    ToolCall,
    ToolCatalog,
    ToolEffect,
    ToolSpec,
)
from contracts.windows import WindowPolicy, WindowStrategy
from ctxfleet_client.client import FleetClient
from contracts.exceptions import CtxError
from tests.fixtures.audit import audit_thread
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import TEST_PARTITIONS, eventually
from tests.fixtures.processes import WorkerProcess, worker_env

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

CATALOG = ToolCatalog(
    release="depot@1",
    paths=(
        PathRule(pattern="item:{id}.location", kind="business_fact"),
        PathRule(pattern="task.goal", kind="goal"),
    ),
    tools=(
        ToolSpec(
            name="move_item",
            effects=(ToolEffect(path="item:{args.item_id}.location", value="{result.location}"),),
            idempotency="required",
        ),
    ),
)

# (matrix id, what happens at that moment, where the fleet dies)
MATRIX = [
    ("K1", "before the model request: while preparing a context", "prepare.before_reply"),
    ("K2", "after the tool request is recorded", "record.after_commit:1"),
    ("K3", "after the tool started, its outcome not yet committed", "record.before_commit:2"),
    ("K4", "after the tool succeeded, while recording the outcome", "record.before_commit:3"),
    ("K5", "after the receipt is written", "record.after_commit:2"),
    ("K6", "after the state patch is committed", "record.after_commit:3"),
    ("K7", "after the last event commit, before notices", "record.after_commit:4"),
    ("K8", "after a checkpoint (summary revision) commits, before the job is acked", "compact.after_commit"),
    ("K8b", "while a summary revision is being committed", "compact.before_commit"),
]
# K9, the window closing, runs under a rollover policy: its own test below.
WINDOW_MATRIX = [
    ("K9a", "while the window closes: handoff written, window not yet switched", "rollover.before_commit"),
    ("K9b", "right after the window closed, before the context is served", "rollover.after_commit"),
]


async def _until_ready(client: FleetClient) -> None:
    async def ready() -> bool:
        try:
            await client.register_catalog(CATALOG)
            return True
        except CtxError:
            return False

    await eventually(ready, timeout=20, what="the fleet to serve requests")


def _events(t: Thread, policy: str = "kp") -> list:  # type: ignore[type-arg]
    first = t.system("You run the depot.").model_copy(update={"agent_release": "depot@1", "policy": policy})
    call = t.assistant("moving item 9", key="a1")
    call = call.model_copy(
        update={
            "payload": call.payload.model_copy(
                update={
                    "tool_calls": (
                        ToolCall(
                            call_id="mv", name="move_item", args={"item_id": 9}, operation_id="op-move-9"
                        ),
                    )
                }
            )
        }
    )
    out = t.outcome("mv", '{"location": "bay_4"}', key="o1")
    out = out.model_copy(update={"payload": out.payload.model_copy(update={"external_ref": "mv-77"})})
    goal = StatePatchEvent(
        payload=StatePatchPayload(
            source="user", ops=(PatchOp(op="set", path="task.goal", value="restock bay 4"),)
        ),
        event_key="goal",
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id="main",
    )
    events = [first, t.user("Move item 9 to bay 4, then check the aisle.", key="task"), call, out, goal]
    for n in range(14):  # enough history to cross the 80% trigger of the 1,800-token policy
        events.append(
            t.assistant(
                "checking the aisle " + "shelf by shelf, carefully " * 12,
                calls=((f"c{n}", "count", {"n": n}),),
                key=f"ca{n}",
            )
        )
        events.append(t.outcome(f"c{n}", "aisle clear " * 30, key=f"co{n}"))
    return events


@pytest.mark.parametrize(("point_id", "moment", "kill_point"), MATRIX, ids=[m[0] for m in MATRIX])
async def test_kill_point_recovers_without_loss_duplicates_or_repeated_side_effects(
    point_id: str,
    moment: str,
    kill_point: str,
    streams: str,
    database_url: str,
    tmp_path: Path,
    db: asyncpg.Connection,
) -> None:
    env = worker_env(streams, database_url, tmp_path / "data", TEST_PARTITIONS, record_batch="4")
    fleet = WorkerProcess(env, tmp_path, workers=("recorder", "assembler", "budgeter", "compactor"))
    client = await FleetClient.connect(streams)
    try:
        fleet.start()
        await _until_ready(client)
        await client.register_policy(
            ContextPolicy(
                name="kp",
                model_profile=None,
                budget_tokens=1_800,
                compaction=CompactionPolicy(keep_recent_groups=1),
            )
        )
        fleet.stop()
        fleet.start(kill_point=kill_point)
        t = Thread()
        events = _events(t)
        for event in events:
            await client.append(event)
        request = PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            budget_tokens=1_800,
            after_event_key=events[-1].event_key,
            wait_ms=3_000,
        )
        assert fleet.proc is not None
        if kill_point.startswith("prepare."):
            # The runtime asks for its context; the fleet dies while preparing it. The runtime sees
            # an error (no reply), never a context.
            await _until_ready(client)
            for _ in range(20):
                with pytest.raises(CtxError) as failed:
                    await client.prepare(request, timeout=5)
                assert failed.value.retryable
                if fleet.proc.poll() is not None:
                    break
        assert await fleet.wait_exit(60) == -signal.SIGKILL, (
            f"{point_id}: the fleet did not die at {kill_point}"
        )

        fleet.start()  # recovery: same ledger, same stream, no memory of the crash
        await _until_ready(client)
        prepared = await client.prepare(
            request.model_copy(update={"budget_tokens": 4_000, "wait_ms": 20_000}), timeout=30
        )

        audit = await audit_thread(db, client, t.thread_id, [e.event_key for e in events])
        assert audit.recorded == audit.expected, f"{point_id}: events lost, duplicated or reordered"
        assert await db.fetchval("SELECT count(*) FROM ctx.dead_letters") == 0
        receipts = await db.fetch("SELECT operation_id, status, external_ref FROM ctx.receipts")
        assert [tuple(r) for r in receipts] == [("op-move-9", "success", "mv-77")], (
            f"{point_id}: side effect bookkeeping"
        )
        receipt = await client.operation_status(
            OperationStatusRequest(session_id=t.session_id, operation_id="op-move-9")
        )
        assert receipt.status == "success"
        assert audit.chain_ok and audit.replay_ok, f"{point_id}: ledger or state diverged"
        assert audit.inspection.state_facts == 2
        assert prepared.budget_report.used.total <= 4_000
        assert (
            prepared.messages[-1].content and '"bay_4"' in prepared.messages[-1].content
        )  # state block rebuilt
        # One statement, one snapshot: a compaction still committing cannot land between two reads.
        both = await db.fetchrow(
            "SELECT (SELECT count(*) FROM ctx.summaries WHERE thread_id=$1) AS summaries,"
            " (SELECT view_revision FROM ctx.thread_views WHERE thread_id=$1) AS revision",
            t.thread_id,
        )
        summaries = both["summaries"]
        # Every committed summary is a revision of the view; no view row means no summary at all.
        revision = both["revision"] if both["revision"] is not None else 0
        assert summaries == revision, f"{point_id}: summary revisions and view disagree"
        if kill_point == "compact.after_commit":
            assert summaries >= 1, f"{point_id}: the checkpoint committed before the kill is gone"
    finally:
        fleet.stop()
        await client.close()


@pytest.mark.parametrize(
    ("point_id", "moment", "kill_point"), WINDOW_MATRIX, ids=[m[0] for m in WINDOW_MATRIX]
)
async def test_kill_while_window_closes_recovers_to_one_window_with_its_handoff_whole_or_absent(
    point_id: str,
    moment: str,
    kill_point: str,
    streams: str,
    database_url: str,
    tmp_path: Path,
    db: asyncpg.Connection,
) -> None:
    env = worker_env(streams, database_url, tmp_path / "data", TEST_PARTITIONS, record_batch="4")
    fleet = WorkerProcess(env, tmp_path, workers=("recorder", "assembler", "budgeter"))
    client = await FleetClient.connect(streams)
    try:
        fleet.start()
        await _until_ready(client)
        await client.register_policy(
            ContextPolicy(
                name="kp9",
                model_profile=None,
                budget_tokens=1_800,
                window=WindowPolicy(strategy=WindowStrategy.ROLLOVER),
            )
        )
        t = Thread()
        events = _events(t, policy="kp9")
        for event in events:
            await client.append(event)
        fleet.stop()
        fleet.start(kill_point=kill_point)
        await _until_ready(client)
        request = PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            # The history deduplicates to ~1,500 tokens: ORANGE under 1,800, past the red line under 1,600.
            budget_tokens=1_600,
            after_event_key=events[-1].event_key,
            wait_ms=10_000,
        )
        # The prepare finds the window past its red line and closes it; the fleet dies meanwhile.
        with pytest.raises(CtxError) as failed:
            await client.prepare(request, timeout=15)
        assert failed.value.retryable
        assert await fleet.wait_exit(60) == -signal.SIGKILL, (
            f"{point_id}: the fleet did not die at {kill_point}"
        )
        windows = await db.fetchval("SELECT count(*) FROM ctx.windows WHERE thread_id = $1", t.thread_id)
        handoffs = await db.fetchval(
            "SELECT count(*) FROM ctx.window_handoffs WHERE thread_id = $1", t.thread_id
        )
        # Exactly one of the two windows: the handoff and the window change commit together or not at all.
        committed = 1 if kill_point == "rollover.after_commit" else 0
        assert (windows, handoffs) == (committed, committed), f"{point_id}: {moment}"

        fleet.start()  # recovery: same ledger, no memory of the crash
        await _until_ready(client)
        prepared = await client.prepare(request, timeout=30)

        assert prepared.window == 2, f"{point_id}: the next context is not window 2"
        rows = await db.fetch(
            "SELECT w.window_no, w.opened_after, h.handoff_id::text AS id, h.body->>'last_event_seq' AS last "
            "FROM ctx.windows w JOIN ctx.window_handoffs h USING (handoff_id) WHERE w.thread_id = $1",
            t.thread_id,
        )
        last_seq = await db.fetchval("SELECT max(seq) FROM ctx.records WHERE thread_id = $1", t.thread_id)
        session_last = await db.fetchval(
            "SELECT max(session_seq) FROM ctx.records WHERE thread_id = $1", t.thread_id
        )
        assert [(r["window_no"], r["id"]) for r in rows] == [(2, prepared.handoff_id)], f"{point_id}"
        assert rows[0]["opened_after"] == int(rows[0]["last"]) == session_last, (last_seq, session_last)
        revision = await db.fetchval(
            "SELECT view_revision FROM ctx.thread_views WHERE thread_id=$1", t.thread_id
        )
        assert revision == 1, f"{point_id}: one window change, one view revision"
        audit = await audit_thread(db, client, t.thread_id, [e.event_key for e in events])
        assert audit.recorded == audit.expected and audit.chain_ok and audit.replay_ok, f"{point_id}"
        texts = "\n".join(m.content or "" for m in prepared.messages)
        assert '"bay_4"' in texts and "aisle clear" not in texts, (
            f"{point_id}: rebuilt from state, not history"
        )
    finally:
        fleet.stop()
        await client.close()
