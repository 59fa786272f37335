"""The kill-point matrix of seed 004 §45: SIGKILL the fleet at each point, restart, check everything.

For every point: the run recovers; no event is lost or recorded twice; no side effect is repeated
(one receipt per operation, never re-requested); state equals its replay from the ledger; the hash
chain holds; and the next prepared context is rebuilt correctly.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
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
from services.client import FleetClient
from services.errors import CtxError
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import TEST_PARTITIONS, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]
ROOT = Path(__file__).resolve().parents[2]

CATALOG = ToolCatalog(
    release="depot@1",
    paths=(PathRule(pattern="item:{id}.location", kind="business_fact"), PathRule(pattern="task.goal", kind="goal")),
    tools=(ToolSpec(name="move_item", effects=(ToolEffect(path="item:{args.item_id}.location", value="{result.location}"),), idempotency="required"),),
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
    ("K9", "while the window closes (summary being committed)", "compact.before_commit"),
]


class FleetProcess:
    def __init__(self, nats_url: str, database_url: str, tmp: Path) -> None:
        self.env = {**os.environ, "CTX_NATS_URL": nats_url, "CTX_DATABASE_URL": database_url,
                    "CTX_DATA_DIR": str(tmp / "data"), "CTX_PARTITIONS": str(TEST_PARTITIONS), "CTX_RECORD_BATCH": "4"}
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, kill_point: str | None) -> None:
        env = dict(self.env)
        if kill_point:
            env["CTX_KILL_POINT"] = kill_point
        else:
            env.pop("CTX_KILL_POINT", None)
        log = open(self.tmp / f"fleet-{kill_point or 'clean'}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "worker", "recorder", "assembler", "budgeter", "compactor"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _until_ready(client: FleetClient) -> None:
    async def ready() -> bool:
        try:
            await client.register_catalog(CATALOG)
            return True
        except CtxError:
            return False

    await eventually(ready, timeout=20, what="the fleet to serve requests")


def _events(t: Thread) -> list:  # type: ignore[type-arg]
    first = t.system("You run the depot.").model_copy(update={"agent_release": "depot@1", "policy": "kp"})
    call = t.assistant("moving item 9", key="a1")
    call = call.model_copy(update={"payload": call.payload.model_copy(update={"tool_calls": (
        ToolCall(call_id="mv", name="move_item", args={"item_id": 9}, operation_id="op-move-9"),)})})
    out = t.outcome("mv", '{"location": "bay_4"}', key="o1")
    out = out.model_copy(update={"payload": out.payload.model_copy(update={"external_ref": "mv-77"})})
    goal = StatePatchEvent(
        payload=StatePatchPayload(source="user", ops=(PatchOp(op="set", path="task.goal", value="restock bay 4"),)),
        event_key="goal", session_id=t.session_id, run_id=t.run_id, instance_id="main",
    )
    events = [first, t.user("Move item 9 to bay 4, then check the aisle.", key="task"), call, out, goal]
    for n in range(14):  # enough history to cross the 80% trigger of the 1,800-token policy
        events.append(t.assistant("checking the aisle " + "shelf by shelf, carefully " * 12, calls=((f"c{n}", "count", {"n": n}),), key=f"ca{n}"))
        events.append(t.outcome(f"c{n}", "aisle clear " * 30, key=f"co{n}"))
    return events


@pytest.mark.parametrize(("point_id", "moment", "kill_point"), MATRIX, ids=[m[0] for m in MATRIX])
async def test_kill_point_recovers_without_loss_duplicates_or_repeated_side_effects(
    point_id: str, moment: str, kill_point: str, streams: str, database_url: str, tmp_path: Path, db: asyncpg.Connection
) -> None:
    fleet = FleetProcess(streams, database_url, tmp_path)
    client = await FleetClient.connect(streams)
    try:
        fleet.start(None)
        await _until_ready(client)
        await client.register_policy(
            ContextPolicy(name="kp", model_profile=None, budget_tokens=1_800, compaction=CompactionPolicy(keep_recent_groups=1))
        )
        fleet.stop()
        fleet.start(kill_point)
        t = Thread()
        events = _events(t)
        for event in events:
            await client.append(event)
        request = PrepareRequest(session_id=t.session_id, run_id=t.run_id, instance_id="main", budget_tokens=1_800,
                                 after_event_key=events[-1].event_key, wait_ms=3_000)
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
        await asyncio.to_thread(fleet.proc.wait, 60)
        assert fleet.proc.returncode == -signal.SIGKILL, f"{point_id}: the fleet did not die at {kill_point}"

        fleet.start(None)  # recovery: same ledger, same stream, no memory of the crash
        await _until_ready(client)
        prepared = await client.prepare(request.model_copy(update={"budget_tokens": 4_000, "wait_ms": 20_000}), timeout=30)

        keys = [r["event_key"] for r in await db.fetch("SELECT event_key FROM ctx.records WHERE thread_id=$1 ORDER BY seq", t.thread_id)]
        assert keys == [e.event_key for e in events], f"{point_id}: events lost, duplicated or reordered"
        assert await db.fetchval("SELECT count(*) FROM ctx.dead_letters") == 0
        receipts = await db.fetch("SELECT operation_id, status, external_ref FROM ctx.receipts")
        assert [tuple(r) for r in receipts] == [("op-move-9", "success", "mv-77")], f"{point_id}: side effect bookkeeping"
        receipt = await client.operation_status(OperationStatusRequest(session_id=t.session_id, operation_id="op-move-9"))
        assert receipt.status == "success"
        inspection = await client.inspect(t.thread_id)
        assert inspection.chain_verified and inspection.state_verified, f"{point_id}: ledger or state diverged"
        assert inspection.state_facts == 2
        assert prepared.budget_report.used.total <= 4_000
        assert prepared.messages[-1].content and '"bay_4"' in prepared.messages[-1].content  # state block rebuilt
        summaries = await db.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id=$1", t.thread_id)
        view = await db.fetchrow("SELECT view_revision, summary_id FROM ctx.thread_views WHERE thread_id=$1", t.thread_id)
        assert view is None or summaries == view["view_revision"], f"{point_id}: summary revisions and view disagree"
    finally:
        fleet.stop()
        await client.close()
