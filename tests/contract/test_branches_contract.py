"""Forks and exports on both stores alike (services/store/branches.py): what a fork
reads of its parent, what it refuses, and what an export writes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contracts.branches import ExportRequest, ForkRequest
from contracts.subjects import DEFAULT_TENANT
from services.app.exporting import export_page
from services.app.forking import fork_session
from services.core.ledger import batch_keys
from services.app.views import ViewLoader
from services.core.compaction.model import StructuredSummary
from services.core.compaction.policy import Counters
from services.core.ledger import RecordingLimits, decode_batch, plan_batch
from services.core.tokens import ENCODINGS, counter_for
from services.core.trace import _parse
from contracts import ErrorCode
from contracts.exceptions import (
    ForkInsideToolGroup,
    NotExportable,
    SeqOutOfRange,
    SessionExists,
    ThreadNotFound,
)
from services.store.views import NewSummary
from tests.fixtures.builders import Thread, incoming

pytestmark = pytest.mark.anyio

COUNTERS = {n: counter_for(n) for n in ENCODINGS}
LIMITS = RecordingLimits()
Store = Any  # MemoryStore | PgStore: the same ports


_stream = iter(range(1, 1_000_000))


async def _write(store: Store, events: list[Any], tenant: str = DEFAULT_TENANT) -> None:
    async with store.connection() as s:
        decoded = decode_batch(incoming(events, start_seq=next(_stream), tenant=tenant), LIMITS)
        plan = plan_batch(decoded, await s.read_for_batch(batch_keys(decoded)), LIMITS, COUNTERS)
        assert not plan.rejections, plan.rejections
        async with s.transaction():
            await s.write_plan(plan, recorded_by="contract", keep_raw=1024)


async def _parent(store: Store) -> Thread:
    """A session of five records: 1 system, 2 question, 3 call, 4 its outcome, 5 an answer."""
    a = Thread()
    await _write(
        store,
        [
            a.system("Be brief.", key="sys"),
            a.user("Fix app.py", key="q"),
            a.assistant("looking", calls=(("c1", "bash", {"cmd": "cat app.py"}),), key="a1"),
            a.outcome("c1", "print('hi')", key="o1"),
            a.assistant("It prints hi.", key="a2"),
        ],
    )
    return a


def _fork(a: Thread, at: int, new: str, **extra: Any) -> ForkRequest:
    return ForkRequest(session_id=a.session_id, at_seq=at, new_session_id=new, **extra)


async def _view(store: Store, thread_id: str) -> list[tuple[int, str, str]]:
    async with store.connection() as s:
        view = await ViewLoader().load(s, thread_id)
    return [(r.seq, r.thread_id, r.kind) for r in view.records]


async def test_a_fork_sees_its_parents_records_up_to_the_point_then_its_own_numbered_after_it(
    store: Store,
) -> None:
    a = await _parent(store)
    before = await _view(store, a.thread_id)
    forked = await fork_session(store, DEFAULT_TENANT, _fork(a, 4, f"{a.session_id}-f"))
    assert (forked.at_seq, forked.next_seq, forked.created) == (4, 5, True)
    f = Thread(session_id=forked.session_id)
    await _write(store, [f.assistant("Another idea.", key="f1"), f.user("go on", key="f2")])

    assert await _view(store, f.thread_id) == [
        *before[:4],
        (5, f.thread_id, "assistant_message"),
        (6, f.thread_id, "user_input"),
    ]
    # The parent is as it was: same records, same head, same session seq.
    assert await _view(store, a.thread_id) == before
    async with store.connection() as s:
        head = await s.select_head(a.thread_id)
        parent = await s.select_fork_parent(DEFAULT_TENANT, a.session_id)
    assert head is not None and head.last_seq == 5 and parent is not None and parent.last_seq == 5
    # The parent keeps recording after its fork, and the fork never sees it.
    await _write(store, [a.user("thanks", key="q2")])
    assert [seq for seq, *_ in await _view(store, f.thread_id)] == [1, 2, 3, 4, 5, 6]


async def test_forking_refuses_what_it_cannot_branch_with_typed_errors(store: Store) -> None:
    a = await _parent(store)
    cases = [
        (_fork(Thread(), 1, "x1"), ThreadNotFound),  # no such session
        (_fork(a, 6, "x2"), SeqOutOfRange),
        (_fork(a, 3, "x3"), ForkInsideToolGroup),  # after the call c1, before its outcome
        (_fork(a, 2, a.session_id), SessionExists),
    ]
    for request, error in cases:
        with pytest.raises(error):
            await fork_session(store, DEFAULT_TENANT, request)
    # Another tenant's session looks exactly like a missing one.
    with pytest.raises(ThreadNotFound):
        await fork_session(store, "acme", _fork(a, 2, "x4"))
    with pytest.raises(ForkInsideToolGroup) as split:
        await fork_session(store, DEFAULT_TENANT, _fork(a, 3, "x5"))
    assert split.value.code is ErrorCode.FORK_INSIDE_TOOL_GROUP and split.value.details["call_ids"] == ["c1"]


async def test_forking_again_with_the_same_request_answers_the_same_fork_and_another_use_of_its_id_is_refused(
    store: Store,
) -> None:
    a = await _parent(store)
    first = await fork_session(store, DEFAULT_TENANT, _fork(a, 2, "fork-same"))
    again = await fork_session(store, DEFAULT_TENANT, _fork(a, 2, "fork-same"))
    assert again == first.model_copy(update={"created": False})
    with pytest.raises(SessionExists):
        await fork_session(store, DEFAULT_TENANT, _fork(a, 4, "fork-same"))


async def test_a_principals_session_forks_only_for_that_principal_and_the_fork_stays_pinned_to_it(
    store: Store,
) -> None:
    a = Thread(principal_id="alice")
    await _write(store, [a.user("hello", key="q")])
    with pytest.raises(ThreadNotFound):
        await fork_session(store, DEFAULT_TENANT, _fork(a, 1, "pf-bob", principal_id="bob"))
    forked = await fork_session(store, DEFAULT_TENANT, _fork(a, 1, "pf-alice", principal_id="alice"))
    mallory = Thread(session_id=forked.session_id, principal_id="mallory")
    async with store.connection() as s:
        decoded = decode_batch(incoming([mallory.user("hi", key="m")], start_seq=next(_stream)), LIMITS)
        plan = plan_batch(decoded, await s.read_for_batch(batch_keys(decoded)), LIMITS, COUNTERS)
    assert [r.code for r in plan.rejections] == [ErrorCode.SCOPE_VIOLATION]


async def test_a_fork_of_a_fork_reads_the_whole_chain_and_a_point_below_its_branch_forks_the_grandparent(
    store: Store,
) -> None:
    a = await _parent(store)
    f = Thread(session_id=(await fork_session(store, DEFAULT_TENANT, _fork(a, 2, "chain-f"))).session_id)
    await _write(store, [f.assistant("plan B", key="f1"), f.user("more", key="f2")])  # seqs 3, 4
    g_req = ForkRequest(session_id=f.session_id, at_seq=3, new_session_id="chain-g")
    g = Thread(session_id=(await fork_session(store, DEFAULT_TENANT, g_req)).session_id)
    await _write(store, [g.user("plan C", key="g1")])
    assert await _view(store, g.thread_id) == [
        (1, a.thread_id, "system"),
        (2, a.thread_id, "user_input"),
        (3, f.thread_id, "assistant_message"),
        (4, g.thread_id, "user_input"),
    ]
    low = await fork_session(
        store, DEFAULT_TENANT, ForkRequest(session_id=f.session_id, at_seq=1, new_session_id="chain-h")
    )
    assert (low.parent_session_id, low.at_seq) == (a.session_id, 1)


async def test_a_fork_starts_from_the_context_origin_its_point_had(store: Store) -> None:
    a = Thread()
    await _write(store, [a.user("old topic", key="q1"), a.reset(key="r"), a.user("new topic", key="q2")])
    await _write(store, [a.reset(key="r2"), a.user("newest topic", key="q3")])  # a reset after the point
    forked = await fork_session(store, DEFAULT_TENANT, _fork(a, 3, "reset-f"))
    assert forked.reset_seq == 2
    f = Thread(session_id=forked.session_id)
    await _write(store, [f.user("forked topic", key="f1")])
    assert [(seq, kind) for seq, _, kind in await _view(store, f.thread_id)] == [
        (3, "user_input"),
        (4, "user_input"),
    ]


async def _export(store: Store, session_id: str, max_bytes: int) -> tuple[str, int]:
    request: ExportRequest | None = ExportRequest(max_bytes=max_bytes)
    chunks: list[str] = []
    while request is not None:
        page = await export_page(store, DEFAULT_TENANT, session_id, request)
        assert len(page.model_dump_json().encode()) <= max_bytes
        chunks.append(page.chunk)
        request = (
            None
            if page.next_after_seq is None
            else ExportRequest(after_seq=page.next_after_seq, offset=page.next_offset, max_bytes=max_bytes)
        )
    return "".join(chunks), len(chunks)


async def test_an_export_is_the_history_as_trace_lines_in_pages_within_their_size_whatever_a_line_holds(
    store: Store,
) -> None:
    a = await _parent(store)
    # A long output with quotes, newlines and control characters: escaping grows it in the reply.
    long = ('"quoted"\n\t\x01 ünïcode ' * 900).strip()
    await _write(
        store,
        [
            a.assistant("again", calls=(("c2", "bash", {"cmd": "cat big.log"}),), key="a3"),
            a.outcome("c2", long, status="error", key="o2"),
            a.run_status("completed", key="end"),
        ],
    )
    whole, pages = await _export(store, a.session_id, 262_144)
    small, many = await _export(store, a.session_id, 4096)
    assert pages == 1 and many > 5 and small == whole
    lines = list(_parse("export", iter(whole.splitlines(keepends=True))))
    assert [(line.kind, line.run) for line in lines] == [
        ("system", a.run_id),
        ("user_input", a.run_id),
        ("assistant_message", a.run_id),
        ("tool_outcome", a.run_id),
        ("assistant_message", a.run_id),
        ("assistant_message", a.run_id),
        ("tool_outcome", a.run_id),
    ]
    assert lines[6].text == long and lines[6].status == "error" and lines[6].call_id == "c2"
    assert lines[2].tool_calls[0].args == {"cmd": "cat app.py"}
    assert json.loads(whole.splitlines()[0]) == {"kind": "system", "run": a.run_id, "text": "Be brief."}


async def test_an_export_of_a_fork_holds_its_parents_history_up_to_the_point_then_its_own(
    store: Store,
) -> None:
    a = await _parent(store)
    forked = await fork_session(store, DEFAULT_TENANT, _fork(a, 2, "export-f"))
    f = Thread(session_id=forked.session_id)
    await _write(store, [f.assistant("plan B", key="f1")])
    text, _ = await _export(store, f.session_id, 262_144)
    assert [(line.kind, line.run, line.text) for line in _parse("x", iter(text.splitlines(True)))] == [
        ("system", a.run_id, "Be brief."),
        ("user_input", a.run_id, "Fix app.py"),
        ("assistant_message", f.run_id, "plan B"),
    ]


async def test_an_export_refuses_a_record_the_trace_format_cannot_carry_and_a_missing_session(
    store: Store,
) -> None:
    a = await _parent(store)
    await _write(store, [a.resource("skill:refunds", "Refunds need a manager.", key="res")])
    with pytest.raises(NotExportable) as refused:
        await _export(store, a.session_id, 262_144)
    assert refused.value.details["seq"] == 6
    with pytest.raises(ThreadNotFound):
        await export_page(store, DEFAULT_TENANT, "no-such-session", ExportRequest())
    with pytest.raises(ThreadNotFound):
        await export_page(store, "acme", a.session_id, ExportRequest())


async def test_a_fork_adopts_its_parents_summary_of_history_it_holds_and_never_one_past_its_point(
    store: Store,
) -> None:
    a = await _parent(store)
    async with store.connection() as s:
        await s.ensure_view(a.thread_id)
        summary_id = await s.commit_summary(0, _summary(a.thread_id, 4))
        parent_view = await s.load_view(a.thread_id)
    at_point = Thread(
        session_id=(await fork_session(store, DEFAULT_TENANT, _fork(a, 4, "adopt-f"))).session_id
    )
    before_point = Thread(
        session_id=(await fork_session(store, DEFAULT_TENANT, _fork(a, 2, "adopt-g"))).session_id
    )
    for t in (at_point, before_point):
        await _write(store, [t.user("and then?", key="q")])
    async with store.connection() as s:
        adopted = await ViewLoader().load(s, at_point.thread_id)
        not_adopted = await ViewLoader().load(s, before_point.thread_id)
        assert await s.load_view(a.thread_id) == parent_view  # adopting wrote the fork's view only
    assert adopted.state.summary is not None and adopted.state.summary.summary_id == summary_id
    assert (adopted.state.covered_to, adopted.baseline.model_steps) == (4, 1)
    assert not_adopted.state.summary is None  # it covers records 3 and 4, which that fork does not hold


async def test_a_fork_does_not_adopt_a_summary_whose_counted_steps_go_past_its_point(store: Store) -> None:
    a = await _parent(store)
    async with store.connection() as s:
        await s.ensure_view(a.thread_id)
        # Committed when the parent stood at seq 5: its baseline counts the step at 5 as compacted.
        await s.commit_summary(0, _summary(a.thread_id, 4, watermark=5))
    f = Thread(session_id=(await fork_session(store, DEFAULT_TENANT, _fork(a, 4, "late-f"))).session_id)
    await _write(store, [f.assistant("plan B", key="f1")])  # the fork's seq 5
    async with store.connection() as s:
        view = await ViewLoader().load(s, f.thread_id)
    assert view.state.summary is None and view.totals.model_steps == 2


def _summary(thread_id: str, covered_to: int, watermark: int | None = None) -> NewSummary:
    return NewSummary(
        thread_id=thread_id,
        parent_summary_id=None,
        body=StructuredSummary(covered_from=1, covered_to=covered_to),
        text="[context summary]",
        tokens_o200k=3,
        tokens_cl100k=3,
        covered_to=covered_to,
        source_watermark=watermark or covered_to,
        policy_name="default",
        policy_revision=1,
        summarizer="contract",
        calls=1,
        trigger_reasons=("context_ratio",),
        tokens_before=100,
        tokens_after=10,
        target_reached=True,
        job_id="job",
        baseline=Counters(1, 1),
        throttle=None,
    )
