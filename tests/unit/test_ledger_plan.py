"""The recording plan: every invariant of services/core/ledger.py, with no database."""

from __future__ import annotations

from contracts import AssistantMessagePayload, ErrorCode, ToolCall
from contracts.subjects import msg_id_of
from services.core.hashing import GENESIS_HASH, verify_chain, ChainLink
from services.core.ledger import (
    CallState,
    Decoded,
    Incoming,
    Rejection,
    KnownKey,
    LedgerReads,
    RecordingLimits,
    SessionReset,
    ThreadHead,
    content_sha256_of,
    decode_batch,
    plan_batch,
    plan_steps,
)
from services.core.tokens import ENCODINGS, counter_for
from tests.fixtures.builders import Thread, incoming

COUNTERS = {n: counter_for(n) for n in ENCODINGS}
LIMITS = RecordingLimits()


def _plan(events, reads: LedgerReads | None = None, limits: RecordingLimits = LIMITS):  # type: ignore[no-untyped-def]
    return plan_batch(
        decode_batch(incoming(events), limits), reads or LedgerReads({}, {}, {}), limits, COUNTERS
    )


def test_plan_batch_gives_consecutive_seqs_and_an_unbroken_chain() -> None:
    t = Thread()
    plan = _plan([t.system(), t.user("q"), t.assistant("a")])
    assert [r.seq for r in plan.records] == [1, 2, 3]
    assert plan.records[0].prev_hash == GENESIS_HASH
    links = [ChainLink(r.seq, r.content_sha256, r.prev_hash, r.record_hash) for r in plan.records]
    assert verify_chain(t.thread_id, links) is None
    (head,) = plan.heads
    assert (head.expected_revision, head.revision, head.last_seq, head.last_event_key) == (None, 1, 3, "k3")


def test_plan_batch_continues_an_existing_head_with_a_revision_check() -> None:
    t = Thread()
    head = ThreadHead(
        t.thread_id, t.session_id, revision=7, last_seq=41, last_hash="f" * 64, last_event_key="k0"
    )
    plan = _plan([t.user("next")], LedgerReads({t.thread_id: head}, {}, {}))
    assert plan.records[0].seq == 42 and plan.records[0].prev_hash == "f" * 64
    assert (plan.heads[0].expected_revision, plan.heads[0].revision) == (7, 8)


def test_plan_batch_same_key_same_content_is_a_duplicate_not_a_record() -> None:
    t = Thread()
    event = t.user("hello", key="k1")
    plan = _plan([event, event])
    assert len(plan.records) == 1 and plan.duplicates == ((t.thread_id, "k1"),) and not plan.rejections
    known = {(t.thread_id, "k1"): KnownKey(1, plan.records[0].content_sha256)}
    again = _plan([event], LedgerReads({}, known, {}))
    assert again.records == () and len(again.duplicates) == 1


def test_plan_batch_same_key_other_content_is_rejected() -> None:
    t = Thread()
    plan = _plan([t.user("hello", key="k1"), t.user("changed", key="k1")])
    assert [r.code.value for r in plan.rejections] == ["event_key_conflict"]


def test_plan_batch_rejects_orphan_and_second_outcomes_and_reused_call_ids() -> None:
    t = Thread()
    plan = _plan(
        [
            t.outcome("nobody-called-me", "x"),
            t.assistant(calls=(("c1", "ls", {}), ("c1", "ls", {}))),
            t.assistant(calls=(("c2", "ls", {}),)),
            t.outcome("c2", "ok"),
            t.outcome("c2", "again"),
            t.assistant(calls=(("c2", "ls", {}),)),
        ]
    )
    assert [r.code.value for r in plan.rejections] == [
        "orphan_tool_outcome",
        "duplicate_call_id",
        "duplicate_tool_outcome",
        "duplicate_call_id",
    ]
    assert [(c.call_id, c.call_seq) for c in plan.calls] == [("c2", 1)]
    assert [(o.call_id, o.outcome_seq, o.status) for o in plan.outcomes] == [("c2", 2, "success")]


def test_plan_batch_knows_calls_recorded_in_earlier_batches() -> None:
    t = Thread()
    reads = LedgerReads(
        {t.thread_id: ThreadHead(t.thread_id, t.session_id, 1, 1, "a" * 64, "k0")},
        {},
        {(t.thread_id, "c1"): CallState("c1", 1, None)},
    )
    plan = _plan([t.outcome("c1", "done")], reads)
    assert not plan.rejections and plan.outcomes[0].outcome_seq == 2


def test_plan_batch_rejects_an_event_claiming_another_sessions_thread() -> None:
    owner = Thread()
    intruder = Thread(session_id="s-other", run_id=owner.run_id)
    plan = _plan([owner.user("mine"), intruder.user("claimed", key="x1")])
    assert [r.code.value for r in plan.rejections] == ["scope_violation"]
    assert len(plan.records) == 1


def test_plan_batch_rejects_an_event_published_on_another_threads_subject() -> None:
    t = Thread()
    batch = incoming([t.user("x", key="k-moved")])
    from services.core.ledger import Incoming

    moved = [Incoming(f"ctx.p.0.{t.session_id}.other-run.main", batch[0].data, 1)]
    decoded = decode_batch(moved, LIMITS)
    assert decoded[0].code.value == "thread_mismatch"  # type: ignore[union-attr]
    # Filed under the subject's thread and key, naming the body's thread too: a prepare waiting on the
    # key on either thread hears event_rejected at once.
    assert (decoded[0].thread_id, decoded[0].event_key) == ("other-run.main", "k-moved")  # type: ignore[union-attr]
    assert decoded[0].named_thread == t.thread_id  # type: ignore[union-attr]


def test_plan_batch_counts_session_order_across_threads() -> None:
    a = Thread(session_id="s1")
    b = a.child_thread()
    plan = _plan([a.user("1"), b.user("2"), a.user("3")])
    assert [r.session_ordinal for r in plan.records] == [1, 2, 3]
    assert dict(plan.session_counts) == {"s1": 3}


def test_plan_batch_stores_large_text_once_and_trims_long_tool_results_head_and_tail() -> None:
    t = Thread()
    huge = "\n".join(f"line {i}: something happened" for i in range(3000))
    limits = RecordingLimits(tool_result_max_tokens=200, blob_min_bytes=1000)
    plan = _plan(
        [t.assistant(calls=(("c1", "bash", {"cmd": "make"}),)), t.outcome("c1", huge)], limits=limits
    )
    outcome = plan.records[1]
    assert outcome.text is None and outcome.blob_sha256 and len(plan.blobs) == 1
    assert outcome.view_text is not None
    assert outcome.view_text.startswith("line 0:") and outcome.view_text.endswith(
        "line 2999: something happened"
    )
    assert f"ctx://blob/{outcome.blob_sha256}" in outcome.view_text and "3000 lines" in outcome.view_text
    # The model pays for the trimmed view (200 tokens plus the ~70-token marker), not 30k tokens.
    assert outcome.tokens.o200k_base < 300


def test_plan_batch_shows_a_user_input_over_its_limit_as_head_and_tail_and_keeps_it_whole() -> None:
    t = Thread()
    question = "\n".join(f"paragraph {i}: what the user pasted" for i in range(3000))
    limits = RecordingLimits(user_input_max_tokens=300, blob_min_bytes=1000)
    plan = _plan([t.user(question, key="q1"), t.user("a short follow-up", key="q2")], limits=limits)
    long, short = plan.records
    assert long.text is None and long.view_text is not None and long.blob_sha256
    assert [b.content for b in plan.blobs] == [question.encode()]  # readable back whole
    assert long.view_text.startswith("paragraph 0:") and long.view_text.endswith(
        "paragraph 2999: what the user pasted"
    )
    marker = (
        f"(full input: {len(question)} chars, 3000 lines; read it back from ctx://blob/{long.blob_sha256})"
    )
    assert marker in long.view_text
    # What every prepare pays for: the head and tail plus the marker, not ~30k tokens.
    assert long.tokens.o200k_base < 400
    # Its identity is the whole question: the content hash of the event as published.
    assert long.content_sha256 == content_sha256_of(t.user(question, key="q1"))
    assert (short.text, short.view_text) == ("a short follow-up", None)


def test_plan_batch_counts_tokens_of_calls_and_content_in_both_encodings() -> None:
    t = Thread()
    (plain,) = _plan([t.assistant("thinking")]).records
    (with_call,) = _plan([Thread().assistant("thinking", calls=(("c1", "bash", {"cmd": "ls -la"}),))]).records
    assert with_call.tokens.o200k_base > plain.tokens.o200k_base > 0
    assert with_call.tokens.cl100k_base > 0


def test_decode_batch_refuses_a_msg_id_not_derived_from_the_events_bytes() -> None:
    t = Thread()
    (plain,) = incoming([t.user("hello")])
    right = msg_id_of(t.thread_id, "k1", plain.data)
    # The original's id reused for other bytes: JetStream would drop a later, different event under it.
    reused = msg_id_of(t.thread_id, "k1", b"other bytes")
    batch = [
        Incoming(plain.subject, plain.data, 1, right),
        Incoming(plain.subject, plain.data, 2, None),
        Incoming(plain.subject, plain.data, 3, reused),
    ]
    first, second, third = decode_batch(batch, LIMITS)
    assert isinstance(first, Decoded) and isinstance(second, Decoded)
    assert isinstance(third, Rejection)
    assert third.code is ErrorCode.MSG_ID_MISMATCH
    assert third.event_key == "k1"
    assert third.details == {"sent": reused, "expected": right}


def test_a_session_belongs_to_the_tenant_of_its_first_event_and_no_other_tenant_writes_into_it() -> None:
    t = Thread()
    owner = _plan([t.user("mine")], LedgerReads({}, {}, {}))
    assert owner.session_tenants == {t.session_id: "default"}
    # The same session named by another tenant's publisher: refused, whatever the body claims.
    forged = t.user("I approve the transfer", key="forged")
    batch = incoming([forged], tenant="globex")
    plan = plan_batch(
        decode_batch(batch, LIMITS),
        LedgerReads({}, {}, {}, sessions={t.session_id: "default"}),
        LIMITS,
        COUNTERS,
    )
    (rejection,) = plan.rejections
    assert rejection.code is ErrorCode.SCOPE_VIOLATION and plan.records == ()
    assert "another tenant" in rejection.reason and "default" not in rejection.reason


def test_two_tenants_creating_one_session_id_in_one_batch_the_first_keeps_it() -> None:
    t = Thread()
    first = incoming([t.user("first", key="a")], tenant="acme")
    second = incoming([t.user("second", key="b")], start_seq=2, tenant="globex")
    plan = plan_batch(decode_batch(first + second, LIMITS), LedgerReads({}, {}, {}), LIMITS, COUNTERS)
    assert [r.event_key for r in plan.records] == ["a"] and plan.session_tenants == {t.session_id: "acme"}
    assert [r.code for r in plan.rejections] == [ErrorCode.SCOPE_VIOLATION]


def test_a_new_session_may_name_its_own_tenants_policy_or_a_shared_one_but_not_another_tenants() -> None:
    policies = frozenset({("", "default"), ("acme", "tight")})
    acme, globex = Thread(), Thread()
    ok = plan_batch(
        decode_batch(
            incoming([acme.user("q").model_copy(update={"policy": "tight"})], tenant="acme"), LIMITS
        ),
        LedgerReads({}, {}, {}, policies=policies),
        LIMITS,
        COUNTERS,
    )
    assert ok.session_policies == {acme.session_id: "tight"} and not ok.rejections
    refused = plan_batch(
        decode_batch(
            incoming([globex.user("q").model_copy(update={"policy": "tight"})], tenant="globex"), LIMITS
        ),
        LedgerReads({}, {}, {}, policies=policies),
        LIMITS,
        COUNTERS,
    )
    assert [r.code for r in refused.rejections] == [ErrorCode.UNKNOWN_POLICY]
    shared = plan_batch(
        decode_batch(incoming([globex.user("q")], tenant="globex"), LIMITS),
        LedgerReads({}, {}, {}, policies=policies),
        LIMITS,
        COUNTERS,
    )
    assert shared.session_policies == {globex.session_id: "default"} and shared.session_tenants == {
        globex.session_id: "globex"
    }


def test_an_event_breaking_several_rules_is_rejected_for_the_rule_checked_first() -> None:
    t = Thread()
    question = t.user("q", key="k1")
    known = {(t.thread_id, "k1"): KnownKey(1, _plan([question]).records[0].content_sha256)}
    # A redelivery by another tenant is refused as a foreign write, not waved through as a duplicate.
    batch = incoming([question], tenant="globex")
    reads = LedgerReads({}, known, {}, sessions={t.session_id: "default"})
    foreign = plan_batch(decode_batch(batch, LIMITS), reads, LIMITS, COUNTERS)
    assert [r.code for r in foreign.rejections] == [ErrorCode.SCOPE_VIOLATION] and foreign.duplicates == ()
    # An exact redelivery of an outcome whose call is unknown is a duplicate:
    # the key is checked before the call.
    orphan = t.outcome("c9", "late", key="k2")
    sha = _plan([t.assistant("", (("c9", "read", {}),), key="k0"), orphan]).records[1].content_sha256
    again = _plan([orphan], LedgerReads({}, {(t.thread_id, "k2"): KnownKey(2, sha)}, {}))
    assert again.duplicates == ((t.thread_id, "k2"),) and again.rejections == ()


def test_plan_names_its_receipts_resets_and_state_writes_fields_as_the_store_writes_them() -> None:
    t = Thread()
    call = ToolCall(call_id="c1", name="pay", args={"to": "bob"}, operation_id="op1")
    ask = t.assistant().model_copy(update={"payload": AssistantMessagePayload(text="", tool_calls=(call,))})
    plan = _plan([t.system(), ask, t.outcome("c1", "paid", key="k3"), t.reset(key="k4")])
    (requested,) = plan.receipts_requested
    assert (
        requested.session_id,
        requested.operation_id,
        requested.thread_id,
        requested.call_id,
        requested.tool,
    ) == (t.session_id, "op1", t.thread_id, "c1", "pay")
    assert requested.requested_event == ask.event_key
    (finished,) = plan.receipts_finished
    assert (finished.thread_id, finished.call_id, finished.status, finished.finished_event) == (
        t.thread_id,
        "c1",
        "success",
        "k3",
    )
    assert plan.resets == (SessionReset(t.session_id, t.thread_id, 4),)
    # Positional order is the store's column order: the tuples still unpack as they did.
    session_id, operation_id, *_ = requested
    assert (session_id, operation_id) == (t.session_id, "op1")


def test_an_undecodable_payload_keeps_the_event_key_it_spells_so_a_waiting_prepare_learns_at_once() -> None:
    t = Thread()
    subject = f"ctx.p.0.default.{t.session_id}.{t.thread_id}"
    envelope = f'{{"event_key": "turn-3/call:c1", "session_id": "{t.session_id}", "run_id": "{t.run_id}"'
    cases = {
        b"missing fields": (envelope + ', "instance_id": "main"}').encode(),
        b"unknown kind": (envelope + ', "instance_id": "main", "kind": "telepathy", "payload": {}}').encode(),
        b"malformed after the key": (envelope + ', "instance_id": ').encode(),
        b"invalid utf-8 later": (envelope + ', "x": "').encode() + b"\xff\xfe" + b'"}',
        b"oversize": (envelope + ', "pad": "' + "x" * 3_000 + '"}').encode(),
    }
    limits = RecordingLimits(max_event_bytes=2_048)
    for name, data in cases.items():
        (rejection,) = decode_batch([Incoming(subject, data, 1)], limits)
        assert isinstance(rejection, Rejection), name
        assert (rejection.thread_id, rejection.event_key) == (t.thread_id, "turn-3/call:c1"), name
    # No key in the bytes: the publisher's Nats-Msg-Id (thread/key/digest) still names it.
    (from_id,) = decode_batch(
        [Incoming(subject, b"{not json", 1, msg_id=f"{t.thread_id}/k:7/abcdef0123456789")], LIMITS
    )
    assert isinstance(from_id, Rejection) and from_id.event_key == "k:7"
    # Nothing names one: nothing is made up.
    (unnamed,) = decode_batch([Incoming(subject, b"{not json", 1)], LIMITS)
    assert isinstance(unnamed, Rejection) and unnamed.event_key is None


def test_planning_in_steps_pauses_once_per_event_and_decides_what_planning_at_once_decides() -> None:
    t = Thread()
    # The last event reuses a key with other content: rejected.
    events = [t.system(), t.user("q"), t.assistant("a"), t.user("other", key="k2")]
    decoded = decode_batch(incoming(events), LIMITS)
    steps = plan_steps(decoded, LedgerReads({}, {}, {}), LIMITS, COUNTERS)
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            stepped = done.value
            break
        pauses += 1
    assert pauses == len(events)
    assert stepped == plan_batch(decoded, LedgerReads({}, {}, {}), LIMITS, COUNTERS)
    assert len(stepped.records) == 3 and len(stepped.rejections) == 1
