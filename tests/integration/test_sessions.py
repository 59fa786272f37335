"""Sessions, runs, threads and children over real NATS and Postgres."""

from __future__ import annotations

import asyncpg
import pytest

from contracts import (
    CompactionPolicy,
    CompactionTriggers,
    ContextPolicy,
    PreparedContext,
    PrepareRequest,
    ReadRequest,
)
from ctxfleet_client.client import FleetClient
from contracts.exceptions import ContentNotFound, EventRejected, ThreadNotFound
from services.app.views import ViewLoader
from services.store.postgres import PgConnection
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

# A model step long enough that a summary of it is a real reduction.
LONG = "{} " + "the step inspected the order records and compared totals " * 12


async def _prepare(
    client: FleetClient, t: Thread, after: str, budget: int = 100_000, **extra: object
) -> PreparedContext:
    request = PrepareRequest.model_validate(
        {
            "session_id": t.session_id,
            "run_id": t.run_id,
            "instance_id": t.instance_id,
            "budget_tokens": budget,
            "after_event_key": after,
            **extra,
        }
    )
    return await client.prepare(request)


def _texts(prepared: PreparedContext) -> list[str]:
    return [m.content or "" for m in prepared.messages]


async def _question_a(client: FleetClient, a: Thread) -> None:
    await client.append(a.system("You are the support agent.", key="sys"))
    await client.append(a.user("Where is order 42?", key="qa"))
    await client.append(
        a.assistant("Looking it up.", calls=(("c1", "mcp.orders.lookup", {"order_id": 42}),), key="a1")
    )
    await client.append(a.outcome("c1", "upstream 503: orders service unavailable", status="error", key="o1"))
    await client.append(a.resource("skill:refunds", "Refunds over 100 EUR need a manager.", key="skill"))
    await client.append(a.assistant("Order 42 could not be retrieved; I will retry later.", key="ans-a"))
    await client.append(a.run_status("completed", key="end-a"))


async def test_one_question_many_loops_share_one_thread(fleet, client: FleetClient) -> None:
    a = Thread()
    await client.append(a.user("go", key="q"))
    for i in range(3):
        await client.append(a.assistant(f"loop {i}", calls=((f"c{i}", "ls", {}),), key=f"a{i}"))
        await client.append(a.outcome(f"c{i}", "ok", key=f"o{i}"))
        prepared = await _prepare(client, a, f"o{i}")
        assert (prepared.run_id, prepared.instance_id) == (a.run_id, "main")
    session = await client.inspect_session(a.session_id)
    assert len(session.runs) == 1 and [t.thread_id for t in session.runs[0].threads] == [a.thread_id]


async def test_new_question_inherits_the_whole_history_once_with_real_status(
    fleet, client: FleetClient
) -> None:
    a = Thread()
    await _question_a(client, a)
    b = a.next_run()
    await client.append(b.user("Any news on order 42?", key="qb"))
    prepared = await _prepare(client, b, "qb")
    texts = _texts(prepared)
    assert texts[0] == "You are the support agent."
    assert "Where is order 42?" in texts and texts[-1] == "Any news on order 42?"
    group = next(m for m in prepared.messages if m.tool_calls)
    call = group.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "mcp.orders.lookup" and call.function.arguments == '{"order_id":42}'
    assert call.id.startswith("c1@")  # the earlier run's call id, kept apart from this run's ids
    result = next(m for m in prepared.messages if m.role == "tool")
    assert (
        result.tool_call_id == call.id
        and result.content == "[tool status: error]\nupstream 503: orders service unavailable"
    )
    assert any("Refunds over 100 EUR need a manager." in t for t in texts)
    keys = [s.event_key for b_ in prepared.blocks for s in b_.sources]
    assert len(keys) == len(set(keys))
    session = await client.inspect_session(a.session_id)
    assert [r.status for r in session.runs] == ["completed", "active"] and session.runs[
        1
    ].snapshot_through == 7


async def test_three_questions_in_a_row_inherit_each_source_once(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    a = Thread()
    await _question_a(client, a)
    b = a.next_run()
    await client.append(b.user("second", key="qb"))
    await client.append(b.assistant("answer b", key="ab"))
    await client.append(b.run_status("completed", key="end-b"))
    c = b.next_run()
    await client.append(c.user("third", key="qc"))
    prepared = await _prepare(client, c, "qc")
    sources = [(s.event_key, s.seq) for blk in prepared.blocks for s in blk.sources]
    assert len(sources) == len(set(sources))
    texts = _texts(prepared)
    assert texts.count("Where is order 42?") == 1 and texts.count("second") == 1 and texts[-1] == "third"


async def test_unclosed_call_of_an_earlier_run_is_state_with_unknown_result_never_a_group(
    fleet, client: FleetClient
) -> None:
    a = Thread()
    await client.append(a.user("refund order 7", key="qa"))
    await client.append(
        a.assistant(calls=(("pay", "payments.refund", {"order": 7, "amount": 120}),), key="a1")
    )
    await client.append(a.run_status("interrupted", reason="runtime crashed", key="end-a"))
    b = a.next_run()
    await client.append(b.user("did the refund go through?", key="qb"))
    prepared = await _prepare(client, b, "qb")
    assert not any(m.tool_calls for m in prepared.messages) and not any(
        m.role == "tool" for m in prepared.messages
    )
    state = next(t for t in _texts(prepared) if t.startswith("[state: 1 tool call(s)"))
    assert 'payments.refund({"order":7,"amount":120}) call pay: result unknown' in state
    assert "will not be executed again" in state
    assert prepared.pending_calls == ()
    assert any("ended interrupted: runtime crashed" in t for t in _texts(prepared))


async def test_resuming_an_old_run_does_not_mix_in_later_questions_and_its_supplement_reaches_the_next_question(  # noqa: E501
    fleet, client: FleetClient
) -> None:
    a = Thread()
    await _question_a(client, a)
    b = a.next_run()
    await client.append(b.user("unrelated later question", key="qb"))
    await client.append(b.run_status("completed", key="end-b"))
    supplement = a.user("The order number is actually 4242.", key="supp")
    await client.append(
        supplement.model_copy(
            update={"payload": supplement.payload.model_copy(update={"intent": "supplement"})}
        )
    )
    resumed = await _prepare(client, a, "supp")
    texts = _texts(resumed)
    assert "unrelated later question" not in texts and texts[-1] == "The order number is actually 4242."
    await client.append(a.run_status("completed", key="end-a2"))
    c = b.next_run()
    await client.append(c.user("so where is it?", key="qc"))
    later = _texts(await _prepare(client, c, "qc"))
    assert "The order number is actually 4242." in later and "unrelated later question" in later


async def test_first_round_is_still_in_the_history_after_seven_questions(fleet, client: FleetClient) -> None:
    t = Thread()
    await client.append(t.user("round 1: remember the code word PELICAN", key="q"))
    await client.append(t.run_status("completed", key="end"))
    for n in range(2, 9):
        t = t.next_run()
        await client.append(t.user(f"round {n}", key="q"))
        await client.append(t.assistant(f"answer {n}", key="a"))
        if n < 8:
            await client.append(t.run_status("completed", key="end"))
    prepared = await _prepare(client, t, "a")
    assert "round 1: remember the code word PELICAN" in _texts(prepared)


async def test_a_new_question_while_a_run_is_active_is_refused_with_run_active(
    fleet, client: FleetClient
) -> None:
    a = Thread()
    await client.append(a.user("long task", key="qa"))
    b = a.next_run()
    await client.append(b.user("impatient second question", key="qb"))
    with pytest.raises(EventRejected) as err:
        await _prepare(client, b, "qb")
    assert err.value.details["rejected_code"] == "run_active"
    assert a.run_id in str(err.value.details["reason"])


async def test_child_sees_only_what_the_parent_exported_and_returns_a_typed_result(
    fleet, client: FleetClient
) -> None:
    parent = Thread()
    await client.append(parent.system("You coordinate.", key="sys"))
    await client.append(parent.user("Audit payments and shipping.", key="q"))
    await client.append(parent.assistant("Private reasoning about the CFO's salary.", key="secret"))
    await client.append(parent.resource("doc:payments", "Payment ledger v3: 1,204 rows.", key="doc"))
    child = parent.child_thread("auditor")
    await client.append(child.system("You audit one ledger.", key="csys"))
    await client.append(child.export([(parent.thread_id, 4)], note="Check this ledger only.", key="grant"))
    await client.append(child.user("Audit the payment ledger.", key="cq"))
    seen = _texts(await _prepare(client, child, "cq"))
    assert any("Payment ledger v3: 1,204 rows." in t for t in seen) and any(
        "Check this ledger only." in t for t in seen
    )
    assert not any("CFO" in t for t in seen) and not any("Audit payments and shipping." == t for t in seen)
    await client.append(child.assistant("Private child scratch notes.", key="cnotes"))
    await client.append(parent.child("All 1,204 rows reconcile.", key="result"))
    back = _texts(await _prepare(client, parent, "result"))
    assert any(
        t.startswith("[material: result of child agent child1") and "All 1,204 rows reconcile." in t
        for t in back
    )
    assert not any("Private child scratch notes." in t for t in back)


async def test_child_reference_beyond_its_grant_is_refused(fleet, client: FleetClient) -> None:
    parent = Thread()
    await client.append(parent.user("coordinate", key="q"))
    other = Thread()
    await client.append(other.user("someone else's secret", key="x"))
    child = parent.child_thread("c")
    await client.append(child.user("start", key="s"))
    await client.append(child.export([(other.thread_id, 1)], key="grab"))
    with pytest.raises(EventRejected) as err:
        await _prepare(client, child, "grab")
    assert err.value.details["rejected_code"] == "grant_violation"
    await client.append(child.export([(parent.thread_id, 99)], key="future"))
    with pytest.raises(EventRejected):
        await _prepare(client, child, "future")


async def test_another_principal_sees_nothing_of_the_session_whatever_ids_it_claims(
    fleet, client: FleetClient
) -> None:
    owner = Thread(principal_id="alice")
    await client.append(owner.user("my secret plan", key="q"))
    await client.append(owner.assistant(calls=(("c", "cat", {"p": "plan.txt"}),), key="a"))
    await client.append(owner.outcome("c", "secret line\n" * 2000, key="o"))
    assert "my secret plan" in _texts(await _prepare(client, owner, "o", principal_id="alice"))
    with pytest.raises(ThreadNotFound):
        await _prepare(client, owner, "o", principal_id="mallory")
    with pytest.raises(ThreadNotFound):
        await _prepare(client, owner, "o")  # no principal at all is not alice either
    preview = _texts(await _prepare(client, owner, "o", principal_id="alice"))[-1]
    ref = preview[preview.index("ctx://blob/") :][: len("ctx://blob/") + 64]
    with pytest.raises(ContentNotFound):
        await client.read(ReadRequest(session_id=owner.session_id, principal_id="mallory", ref=ref))
    assert (
        await client.read(ReadRequest(session_id=owner.session_id, principal_id="alice", ref=ref))
    ).sha256_verified
    intruder = Thread(session_id=owner.session_id, run_id=owner.run_id, principal_id="mallory")
    await client.append(intruder.user("let me in", key="in"))
    with pytest.raises(EventRejected) as err:
        await _prepare(client, owner, "in", principal_id="alice")
    assert err.value.details["rejected_code"] == "scope_violation"


async def test_reset_starts_a_new_context_origin_and_drops_summaries_but_history_stays_readable(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    a = Thread()
    await client.append(a.user("old topic: the blue widget", key="q1"))
    await client.append(a.assistant("noted", key="a1"))
    await client.append(a.reset(key="reset"))
    await client.append(a.user("new topic", key="q2"))
    texts = _texts(await _prepare(client, a, "q2"))
    assert texts == ["new topic"]
    inspection = await client.inspect(a.thread_id)
    assert inspection.record_count == 4 and inspection.chain_verified
    assert (await db.fetchval("SELECT reset_seq FROM ctx.sessions WHERE session_id=$1", a.session_id)) == 3


async def test_a_b_c_then_resume_a_and_compact_then_d_counts_everything_once(
    start_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    fleet = await start_fleet()
    policy = ContextPolicy(
        name="steps3",
        model_profile=None,
        budget_tokens=100_000,
        compaction=CompactionPolicy(
            triggers=CompactionTriggers(context_ratio=None, model_steps=3), keep_recent_groups=0
        ),
    )
    await client.register_policy(policy)
    a = Thread()
    await client.append(a.user("A?", key="q").model_copy(update={"policy": "steps3"}))
    await client.append(a.assistant(LONG.format("a1"), key="s1"))
    await client.append(a.run_status("completed", key="end"))
    b = a.next_run()
    await client.append(b.user("B?", key="q"))
    await client.append(b.assistant(LONG.format("b1"), key="s1"))
    await client.append(b.run_status("completed", key="end"))
    c = b.next_run()
    await client.append(c.user("C?", key="q"))
    await client.append(c.assistant(LONG.format("c1"), key="s1"))  # third step of the session: C compacts

    async def summarized(t: Thread, n: int = 1) -> bool:
        return (
            int(await db.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id=$1", t.thread_id)) >= n
        )

    await eventually(lambda: summarized(c), what="C's compaction")
    await client.append(c.run_status("completed", key="end"))
    await client.append(a.user("and one more thing for A", key="resume"))
    await client.append(a.assistant(LONG.format("a2"), key="s2"))
    await client.append(a.assistant(LONG.format("a3"), key="s3"))  # A's own view: 3 steps → A compacts
    await eventually(lambda: summarized(a), what="resumed A's compaction")
    await client.append(a.run_status("completed", key="end2"))
    d = c.next_run()
    await client.append(d.user("D?", key="q"))
    await _prepare(client, d, "q")
    async with fleet.pool.acquire() as conn:
        view = await ViewLoader().load(PgConnection(conn), d.thread_id)
    c_summary = await db.fetchval("SELECT summary_id FROM ctx.thread_views WHERE thread_id=$1", c.thread_id)
    assert view.state.summary is not None and view.state.summary.summary_id == str(
        c_summary
    )  # not resumed A's view
    # D holds A's three steps (including the resumed two), B's and C's: five, each counted once;
    # since C's compaction only A's resumed steps are new.
    assert (view.totals.model_steps, view.baseline.model_steps) == (5, 3)
    heads = [r.text.split(" ", 1)[0] for r in view.records if r.kind == "assistant_message"]
    assert heads == ["a1", "b1", "c1", "a2", "a3"]


async def test_replay_of_a_trace_with_runs_starts_a_new_run_that_inherits_the_first(
    fleet, client: FleetClient, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    from services.edge.replay import ReplayOptions, replay_trace
    from services.core.trace import read_trace

    trace = tmp_path / "two-runs.jsonl"
    trace.write_text(
        '{"kind": "system", "text": "You help.", "run": "q1"}\n'
        '{"kind": "user_input", "text": "first question: the code word is OSPREY", "run": "q1"}\n'
        '{"kind": "assistant_message", "text": "noted", "run": "q1"}\n'
        '{"kind": "user_input", "text": "second question: what was the code word?", "run": "q2"}\n'
        '{"kind": "assistant_message", "text": "OSPREY", "run": "q2"}\n'
    )
    report = await replay_trace(
        client,
        read_trace(trace),
        ReplayOptions(session_id="s-replay-runs", model_profile=None, budget_tokens=10_000),
    )
    assert report.totals["errors"] == 0 and report.totals["prepares"] == 2
    session = await client.inspect_session("s-replay-runs")
    assert [r.status for r in session.runs] == ["completed", "active"]
    second = session.runs[1]
    prepared = await client.prepare(
        PrepareRequest(
            session_id="s-replay-runs", run_id=second.run_id, instance_id="main", budget_tokens=10_000
        )
    )
    assert "first question: the code word is OSPREY" in _texts(prepared)


async def test_a_session_keeps_its_agent_release_and_refuses_another(fleet, client: FleetClient) -> None:
    a = Thread()
    await client.append(a.user("hello", key="q").model_copy(update={"agent_release": "support-agent@41"}))
    await client.append(a.assistant("hi", key="ok").model_copy(update={"agent_release": "support-agent@41"}))
    await _prepare(client, a, "ok")
    await client.append(a.user("again", key="q2").model_copy(update={"agent_release": "support-agent@42"}))
    with pytest.raises(EventRejected) as err:
        await _prepare(client, a, "q2")
    assert err.value.details["rejected_code"] == "release_mismatch"
