"""The store ports' contract, run against the in-memory store and PostgreSQL alike.

Whatever a service can observe through a port — what is read back, which typed error a racing or
refused write raises, what a failed transaction leaves — must be the same on both, or unit tests on
the memory store would prove nothing about production.
"""

from __future__ import annotations

from dataclasses import replace

from typing import Any

import pytest

from contracts import ContextPolicy
from contracts.subjects import DEFAULT_TENANT
from contracts.windows import RolloverTrigger, WindowHandoff
from services.core.compaction.model import StructuredSummary
from services.core.compaction.policy import Counters
from contracts import ErrorCode
from contracts.exceptions import DuplicateEvent, RevisionConflict
from services.core.hashing import verify_chain
from services.core.ledger import Incoming, RecordingLimits, Rejection, decode_batch, plan_batch
from services.core.ledger import batch_keys
from contracts.exceptions import StoreRejected
from services.store.views import NewSummary, ViewState, summary_id_of
from services.core.tokens import ENCODINGS, counter_for
from tests.fixtures.builders import Thread, incoming

pytestmark = pytest.mark.anyio

COUNTERS = {n: counter_for(n) for n in ENCODINGS}
LIMITS = RecordingLimits()
Store = Any  # MemoryStore | PgStore: the same ports


async def _plan(s: Any, events: list[Any], start_seq: int = 1, *, known_keys: bool = True) -> Any:
    decoded = decode_batch(incoming(events, start_seq=start_seq), LIMITS)
    touched = batch_keys(decoded)
    if not known_keys:  # planned as if the keys were never read: a writer that raced another
        touched = replace(touched, keys=[])
    return plan_batch(decoded, await s.read_for_batch(touched), LIMITS, COUNTERS)


async def _write(store: Store, events: list[Any], start_seq: int = 1) -> None:
    async with store.connection() as s:
        plan = await _plan(s, events, start_seq)
        async with s.transaction():
            await s.write_plan(plan, recorded_by="contract", keep_raw=1024)


async def test_written_records_read_back_alike(store: Store) -> None:
    t = Thread()
    await _write(
        store,
        [
            t.system("Be brief.", key="sys"),
            t.user("Fix app.py", key="u1"),
            t.assistant("looking", calls=(("c1", "bash", {"cmd": "cat app.py"}),), key="a1"),
        ],
    )
    async with store.connection() as s:
        head = await s.select_head(t.thread_id)
        assert head is not None and (head.revision, head.last_seq, head.last_event_key) == (1, 3, "a1")
        records = await s.select_records(t.thread_id, gt=1, lte=3)
        assert [(r.thread_seq, r.seq, r.event_key, r.kind, r.text) for r in records] == [
            (2, 2, "u1", "user_input", "Fix app.py"),
            (3, 3, "a1", "assistant_message", records[1].text),
        ]
        assert records[0].tokens.o200k_base > 0
        assert (await s.find_event_outcome(DEFAULT_TENANT, t.thread_id, "u1")).seq == 2
        assert (await s.find_event_outcome("another-tenant", t.thread_id, "u1")).seq is None
        recorded_sha = (await s.select_links(t.thread_id))[1].content_sha256
        assert await s.find_event_outcome(DEFAULT_TENANT, t.thread_id, "u1") == (2, recorded_sha, None)
        assert await s.find_event_outcome("another-tenant", t.thread_id, "u1") == (None, None, None)
        assert await s.find_event_outcome(DEFAULT_TENANT, t.thread_id, "never") == (None, None, None)
        assert await s.open_call_ids(t.thread_id) == ["c1"]
        assert (await s.totals(t.thread_id))[0] == 3
        assert verify_chain(t.thread_id, await s.select_links(t.thread_id)) is None
        assert [r.event_key for r in await s.select_tail(t.thread_id, limit=2, preview_chars=3)] == [
            "a1",
            "u1",
        ]
        assert (await s.select_tail(t.thread_id, limit=1, preview_chars=3))[0].preview == records[1].text[:3]
        scope = await s.scope_of(t.thread_id)
        assert (scope.role, scope.tenant, scope.reset_seq, scope.run_status) == (
            "main",
            DEFAULT_TENANT,
            0,
            "active",
        )
        assert await s.session_policy(t.session_id) == (DEFAULT_TENANT, "default", 1)
        assert await s.load_view(t.thread_id) == ViewState()
        assert [e[1] for e in await s.select_full(t.thread_id)] == ["sys", "u1", "a1"]
        evidence = await s.select_evidence(t.session_id, [(t.thread_id, 2), (t.thread_id, 9)])
        assert list(evidence) == [(t.thread_id, 2)] and evidence[(t.thread_id, 2)].text == "Fix app.py"
        assert await s.select_evidence("another-session", [(t.thread_id, 2)]) == {}


async def test_a_plan_on_a_moved_head_is_a_revision_conflict_and_writes_nothing(store: Store) -> None:
    t = Thread()
    await _write(store, [t.user("one", key="k1")])
    async with store.connection() as s:
        a = await _plan(s, [t.user("two", key="k2")], 2)
        b = await _plan(s, [t.user("three", key="k3")], 3)
        async with s.transaction():
            await s.write_plan(a, recorded_by="a", keep_raw=1024)
        with pytest.raises(RevisionConflict):
            async with s.transaction():
                await s.write_plan(b, recorded_by="b", keep_raw=1024)
        head = await s.select_head(t.thread_id)
        assert head is not None and (head.revision, head.last_event_key) == (2, "k2")
        assert (await s.find_event_outcome(DEFAULT_TENANT, t.thread_id, "k3")).seq is None


async def test_a_key_recorded_meanwhile_is_a_duplicate_event_and_writes_nothing(store: Store) -> None:
    t = Thread()
    await _write(store, [t.user("one", key="k1")])
    async with store.connection() as s:
        stale = await _plan(s, [t.user("one", key="k1")], 2, known_keys=False)
        with pytest.raises(DuplicateEvent):
            async with s.transaction():
                await s.write_plan(stale, recorded_by="b", keep_raw=1024)
        assert (await s.select_head(t.thread_id)).revision == 1  # type: ignore[union-attr]


async def test_a_transaction_whose_block_raises_leaves_nothing(store: Store) -> None:
    t = Thread()
    with pytest.raises(ZeroDivisionError):
        async with store.connection() as s:
            plan = await _plan(s, [t.user("one", key="k1")])
            async with s.transaction():
                await s.write_plan(plan, recorded_by="a", keep_raw=1024)
                await s.insert_tracking("contract", 0, 7)
                raise ZeroDivisionError
    async with store.connection() as s:
        assert await s.select_head(t.thread_id) is None
        assert await s.max_tracking_seq("contract", 0) == 0


async def test_tracking_never_moves_backwards(store: Store) -> None:
    async with store.connection() as s:
        await s.insert_tracking("contract", 3, 10)
        await s.insert_tracking("contract", 3, 4)
        assert (await s.max_tracking_seq("contract", 3), await s.max_tracking_seq("contract", 4)) == (10, 0)


async def test_a_dead_letter_is_stored_once_and_found_only_by_its_tenant(store: Store) -> None:
    t = Thread()
    (message,) = incoming([t.user("x", key="bad")], start_seq=41)
    rejection = Rejection(
        Incoming(message.subject, message.data, 41),
        t.thread_id,
        "bad",
        ErrorCode.INVALID_EVENT,
        "no",
        {"why": "test"},
    )
    async with store.connection() as s:
        await s.insert_dead_letter(rejection, keep_raw=16)
        await s.insert_dead_letter(rejection, keep_raw=16)  # redelivered
        assert await s.count_dead_letters(t.thread_id) == 1
        assert (await s.find_event_outcome(DEFAULT_TENANT, t.thread_id, "bad")).rejected == (
            "invalid_event",
            "no",
        )
        assert (await s.find_event_outcome("another-tenant", t.thread_id, "bad")).rejected is None
        assert await s.find_event_outcome(DEFAULT_TENANT, t.thread_id, "bad") == (
            None,
            None,
            ("invalid_event", "no"),
        )
        assert await s.find_event_outcome("another-tenant", t.thread_id, "bad") == (None, None, None)


async def test_a_dead_letter_of_an_event_on_another_threads_subject_is_found_under_both_threads(
    store: Store,
) -> None:
    subject_thread, body_thread = Thread(), Thread()
    (message,) = incoming([subject_thread.user("x", key="misfiled")], start_seq=43)
    rejection = Rejection(
        Incoming(message.subject, message.data, 43),
        subject_thread.thread_id,
        "misfiled",
        ErrorCode.THREAD_MISMATCH,
        "wrong subject",
        {},
        named_thread=body_thread.thread_id,
    )
    refused, unknown = (None, None, ("thread_mismatch", "wrong subject")), (None, None, None)
    async with store.connection() as s:
        await s.insert_dead_letter(rejection, keep_raw=16)
        for thread in (subject_thread, body_thread):
            assert await s.find_event_outcome(DEFAULT_TENANT, thread.thread_id, "misfiled") == refused
        assert await s.find_event_outcome(DEFAULT_TENANT, Thread().thread_id, "misfiled") == unknown
        assert await s.find_event_outcome("another-tenant", body_thread.thread_id, "misfiled") == unknown
        # Inspection counts it where it was published, once.
        assert await s.count_dead_letters(subject_thread.thread_id) == 1
        assert await s.count_dead_letters(body_thread.thread_id) == 0


async def test_the_pending_job_slot_is_held_once_until_its_holder_clears_it(store: Store) -> None:
    t = Thread()
    await _write(store, [t.user("one", key="k1")])
    async with store.connection() as s:
        await s.ensure_view(t.thread_id)
        assert await s.set_pending(t.thread_id, "job-a", stale_after_s=300)
        assert not await s.set_pending(t.thread_id, "job-b", stale_after_s=300)
        await s.clear_pending(t.thread_id, "job-b")  # not the holder: no effect
        assert (await s.load_view(t.thread_id)).pending_fingerprint == "job-a"
        await s.clear_pending(t.thread_id, "job-a")
        assert await s.set_pending(t.thread_id, "job-b", stale_after_s=300)
        await s.record_attempt(
            t.thread_id, throttle=None, reason="select: nothing", failed=True, fingerprint="job-b"
        )
        state = await s.load_view(t.thread_id)
        assert (state.pending_fingerprint, state.attempts, state.failures, state.last_failure) == (
            None,
            1,
            1,
            "select: nothing",
        )
        await s.mark_evaluated(t.thread_id, 5)
        await s.mark_evaluated(t.thread_id, 3)
        assert (await s.load_view(t.thread_id)).evaluated_revision == 5


async def test_a_view_of_an_unrecorded_thread_is_refused(store: Store) -> None:
    async with store.connection() as s:
        with pytest.raises(StoreRejected):
            await s.ensure_view("r-none.main")


def _summary(thread_id: str, covered_to: int) -> NewSummary:
    return NewSummary(
        thread_id=thread_id,
        parent_summary_id=None,
        body=StructuredSummary(covered_from=1, covered_to=covered_to),
        text="[context summary]",
        tokens_o200k=3,
        tokens_cl100k=3,
        covered_to=covered_to,
        source_watermark=covered_to,
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


async def test_a_summary_commits_once_per_view_revision_under_a_derived_id(store: Store) -> None:
    t = Thread()
    await _write(store, [t.user("one", key="k1"), t.user("two", key="k2")])
    async with store.connection() as s:
        await s.ensure_view(t.thread_id)
        summary_id = await s.commit_summary(0, _summary(t.thread_id, 2))
        assert summary_id == summary_id_of(t.thread_id, 1, 1, 2)
        with pytest.raises(RevisionConflict) as lost:
            await s.commit_summary(0, _summary(t.thread_id, 1))
        assert lost.value.details["actual"] == 1
        state = await s.load_view(t.thread_id)
        assert (
            state.view_revision == 1 and state.summary is not None and state.summary.summary_id == summary_id
        )
        assert (state.covered_to, state.baseline, state.baseline_watermark) == (2, Counters(1, 1), 2)
        assert await s.summary_count(t.thread_id) == 1


async def test_a_summarys_chain_is_the_summaries_it_extends_parent_first_with_their_revisions(
    store: Store,
) -> None:
    t = Thread()
    await _write(store, [t.user(f"u{n}", key=f"k{n}") for n in range(1, 5)])
    async with store.connection() as s:
        await s.ensure_view(t.thread_id)
        first = await s.commit_summary(0, _summary(t.thread_id, 2))
        second = await s.commit_summary(1, replace(_summary(t.thread_id, 3), parent_summary_id=first))
        third = await s.commit_summary(2, replace(_summary(t.thread_id, 4), parent_summary_id=second))
        chain = await s.summary_chain(third)
        assert [(revision, row.summary_id, row.body.covered_to) for revision, row in chain] == [
            (2, second, 3),
            (1, first, 2),
        ]
        assert await s.summary_chain(first) == []


async def test_policies_are_revisioned_per_tenant_beside_the_shared_built_ins(store: Store) -> None:
    policy = ContextPolicy(name=f"p-{Thread().run_id}", model_profile=None, budget_tokens=4_000)
    assert await store.register_policy("acme", policy) == 1
    assert await store.register_policy("acme", policy) == 2
    async with store.connection() as s:
        found = await s.get_policy("acme", policy.name)
        assert found is not None and found[0] == 2 and found[1].budget_tokens == 4_000
        assert await s.get_policy("globex", policy.name) is None
        assert (await s.get_policy("globex", "default", 1)) is not None


async def test_a_new_run_may_adopt_an_earlier_runs_summary_once(store: Store) -> None:
    a = Thread()
    await _write(
        store, [a.user("one", key="k1"), a.assistant("two", key="k2"), a.run_status("completed", key="end")]
    )
    b = a.next_run()
    await _write(store, [b.user("three", key="k3")], 4)
    async with store.connection() as s:
        await s.ensure_view(a.thread_id)
        summary_id = await s.commit_summary(0, _summary(a.thread_id, 2))
        scope = await s.scope_of(b.thread_id)
        assert scope.snapshot_through == 3
        (candidate,) = await s.candidates(b.session_id, b.thread_id, scope.snapshot_through)
        assert (candidate.thread_id, candidate.summary_id, candidate.covered_to) == (
            a.thread_id,
            summary_id,
            2,
        )
        assert await s.candidates(b.session_id, b.thread_id, 1) == []
        assert await s.adopt(b.thread_id, 0, candidate)
        assert not await s.adopt(b.thread_id, 1, candidate)  # it shows a summary already
        state = await s.load_view(b.thread_id)
        assert (state.view_revision, state.covered_to, state.baseline_watermark) == (1, 2, 2)
        assert state.summary is not None and state.summary.summary_id == summary_id
        inherited = await s.select_inherited(
            b.session_id, after=0, through=scope.snapshot_through, exclude_thread=b.thread_id
        )
        assert [r.event_key for r in inherited] == ["k1", "k2", "end"]


async def test_a_context_reset_moves_the_session_fence_and_empties_its_views(store: Store) -> None:
    t = Thread()
    await _write(store, [t.user("one", key="k1"), t.user("two", key="k2")])
    async with store.connection() as s:
        await s.ensure_view(t.thread_id)
        await s.commit_summary(0, _summary(t.thread_id, 2))
    await _write(store, [t.reset(key="r1"), t.user("three", key="k3")], 3)
    async with store.connection() as s:
        scope = await s.scope_of(t.thread_id)
        state = await s.load_view(t.thread_id)
    assert scope.reset_seq == 3
    assert (state.view_revision, state.summary, state.covered_to, state.baseline_watermark) == (2, None, 0, 3)


async def test_a_message_of_tool_calls_only_is_previewed_by_the_names_of_its_calls(store: Store) -> None:
    t = Thread()
    await _write(
        store,
        [
            t.user("Fix app.py", key="u1"),
            t.assistant(
                calls=(("c1", "bash", {"cmd": "pytest"}), ("c2", "read_file", {"path": "app.py"})), key="a1"
            ),
        ],
    )
    async with store.connection() as s:
        calls_only, question = await s.select_tail(t.thread_id, limit=2, preview_chars=160)
    assert calls_only.preview == "calls: bash, read_file"
    assert question.preview == "Fix app.py"


async def test_an_output_kept_whole_as_a_blob_is_previewed_from_the_blob(store: Store) -> None:
    # Over the masking threshold, under the cut: stored only as a blob, with no view text.
    output = "é collected 12 items / " * 50
    t = Thread()
    await _write(
        store,
        [
            t.assistant(calls=(("c1", "bash", {"cmd": "pytest"}),), key="a1"),
            t.outcome("c1", output, key="o1"),
        ],
    )
    async with store.connection() as s:
        (kept,) = await s.select_tail(t.thread_id, limit=1, preview_chars=41)
    assert kept.blob_sha256 is not None
    assert kept.preview == output[:41]


async def test_a_tail_names_the_tools_of_each_call_and_outcome_with_the_outcomes_status(store: Store) -> None:
    t = Thread()
    await _write(
        store,
        [
            t.user("Fix app.py", key="u1"),
            t.assistant(
                calls=(("c1", "bash", {"cmd": "pytest"}), ("c2", "read_file", {"path": "app.py"})), key="a1"
            ),
            t.outcome("c1", "1 failed", key="o1"),
            t.outcome("c2", "no such file", status="error", key="o2"),
        ],
    )
    async with store.connection() as s:
        tail = await s.select_tail(t.thread_id, limit=4, preview_chars=40)
    assert [(r.event_key, r.tools, r.status) for r in tail] == [
        ("o2", ("read_file",), "error"),
        ("o1", ("bash",), "success"),
        ("a1", ("bash", "read_file"), None),
        ("u1", (), None),
    ]


def _handoff(
    thread_id: str, last_seq: int, *, handoff_id: str = "7d1c0a5e-3a71-5b8f-9c3e-0f1e2d3c4b5a"
) -> Any:
    return WindowHandoff(
        handoff_id=handoff_id,
        thread_id=thread_id,
        task_id="run",
        previous_window=1,
        new_window=2,
        trigger=RolloverTrigger.HARD_LIMIT,
        state_version=0,
        state_hash="0" * 64,
        last_event_seq=last_seq,
        required_state_paths=("item:1.location",),
        checkpoint_id="5f2b3c4d-1e0a-5b6c-8d7e-9f0a1b2c3d4e",
    )


async def test_commit_window_opens_window_2_and_refuses_a_stale_view_revision_alike(store: Store) -> None:
    t = Thread()
    await _write(store, [t.system("Be brief.", key="sys"), t.user("Fix app.py", key="u1")])
    async with store.connection() as s:
        assert await s.current_window(t.thread_id) is None
        assert await s.commit_window(0, _handoff(t.thread_id, 2), 40) == 1
        opened = await s.current_window(t.thread_id)
        assert (opened.number, opened.opened_after, opened.handoff) == (2, 2, _handoff(t.thread_id, 2))
        assert await s.windows_closed_after(t.thread_id) == [2]
        assert (await s.load_view(t.thread_id)).view_revision == 1
        with pytest.raises(RevisionConflict):
            await s.commit_window(
                0, _handoff(t.thread_id, 2, handoff_id="0c6f0d7e-8a9b-5c1d-9e2f-3a4b5c6d7e8f"), 40
            )
        assert await s.windows_closed_after(t.thread_id) == [2]


async def test_the_records_read_with_the_head_are_the_records_read_alone(store: Store) -> None:
    # A read-your-writes view load takes the records after the ones it holds in the head's statement;
    # they must be exactly what the records' own read gives: inline text, a blob's text, a preview.
    t = Thread()
    await _write(
        store,
        [
            t.system("Be brief.", key="sys"),
            t.user("Fix app.py", key="u1"),
            t.assistant("looking", calls=(("c1", "bash", {"cmd": "cat app.py"}),), key="a1"),
            t.outcome("c1", "line of app.py\n" * 2_000, key="o1"),  # kept as a blob, with a preview
            t.user("and the tests", key="u2"),
        ],
    )
    async with store.connection() as s:
        for after in (0, 2, 4, 5):
            at_head = await s.thread_at_head(t.thread_id, records_after=after)
            assert at_head is not None and at_head.records is not None
            alone = await s.select_records(t.thread_id, gt=after, lte=at_head.head.last_seq)
            assert at_head.records == alone
            assert [r.recorded_at for r in at_head.records] == [r.recorded_at for r in alone]
            assert [r.thread_seq for r in at_head.records] == list(range(after + 1, 6))
        outcome = next(r for r in (await s.select_records(t.thread_id, gt=0, lte=5)) if r.event_key == "o1")
        assert outcome.text.startswith("line of app.py") and outcome.mask_text is not None
        plain = await s.thread_at_head(t.thread_id)
        assert plain is not None and plain.records is None  # not asked for, not read
