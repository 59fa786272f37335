"""The wire: decoding raw events, ids that are safe in subjects, request validation."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from contracts import (
    ErrorCode,
    EventDecodeError,
    ModelProfile,
    PrepareRequest,
    SearchRequest,
    ToolOutcomeEvent,
    decode_event,
    split_thread_id,
    thread_id_of,
)
from contracts.subjects import (
    events_subject,
    StoredSubject,
    inspect_subject,
    parse_stored_subject,
    partition_filter,
    prepare_subject,
    tenant_subject,
    partition_of,
    partition_transform,
    thread_from_partitioned_subject,
)

ENVELOPE = {"event_key": "k1", "session_id": "s1", "run_id": "r1", "instance_id": "main"}


def _raw(**fields: object) -> bytes:
    return json.dumps({**ENVELOPE, **fields}).encode()


def test_decode_event_reads_every_kind_with_defaults() -> None:
    event = decode_event(_raw(kind="tool_outcome", payload={"call_id": "c1"}), max_bytes=1000)
    assert isinstance(event, ToolOutcomeEvent)
    assert (event.payload.status.value, event.payload.text, event.thread_id) == ("success", "", "r1.main")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (_raw(kind="user_input", payload={"text": "x" * 200}), ErrorCode.PAYLOAD_TOO_LARGE),
        (b'{"kind": "user_input", "x": "\xc3\x28"}', ErrorCode.INVALID_ENCODING),
        (b'{"kind": ', ErrorCode.MALFORMED_JSON),
        (b"[1, 2]", ErrorCode.INVALID_EVENT),
        (_raw(kind="dream", payload={}), ErrorCode.UNKNOWN_EVENT_KIND),
        (_raw(payload={}), ErrorCode.UNKNOWN_EVENT_KIND),
        (json.dumps({"kind": "user_input", "payload": {"text": "x"}}).encode(), ErrorCode.INVALID_EVENT),
        (_raw(kind="user_input", payload={"text": "x", "extra": 1}), ErrorCode.INVALID_EVENT),
        (_raw(kind="user_input", payload={"text": "x"}, run_id="has.dot"), ErrorCode.INVALID_EVENT),
        (_raw(kind="tool_outcome", payload={"call_id": "c", "status": "great"}), ErrorCode.INVALID_EVENT),
    ],
    ids=[
        "too-large",
        "bad-utf8",
        "bad-json",
        "not-an-object",
        "unknown-kind",
        "no-kind",
        "missing-fields",
        "extra-field",
        "dotted-id",
        "bad-status",
    ],
)
def test_decode_event_rejects_bad_input_with_a_stable_code(raw: bytes, code: ErrorCode) -> None:
    with pytest.raises(EventDecodeError) as err:
        decode_event(raw, max_bytes=150)
    assert err.value.code is code and err.value.message


def test_decode_event_missing_field_names_the_field() -> None:
    with pytest.raises(EventDecodeError) as err:
        decode_event(json.dumps({"kind": "user_input", "payload": {"text": "x"}}).encode(), max_bytes=1000)
    assert "event_key" in err.value.message


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (_raw(kind="telepathy", payload={}), "unknown event kind 'telepathy'"),
        (_raw(payload={}), "missing field kind"),
        (_raw(kind=None, payload={}), "field kind must be a string, not null"),
    ],
    ids=["unknown", "missing", "null"],
)
def test_decode_event_says_which_kind_is_unknown_or_that_there_is_none(raw: bytes, says: str) -> None:
    with pytest.raises(EventDecodeError) as err:
        decode_event(raw, max_bytes=1000)
    assert err.value.code is ErrorCode.UNKNOWN_EVENT_KIND and err.value.message.startswith(says)
    assert "None" not in err.value.message


@pytest.mark.parametrize(
    "raw",
    [
        _raw(kind="phase_change", payload={"phase": "verify", "expected_steps": "4"}),
        _raw(kind="user_input", payload={"text": "x"}, schema_version=True),
        _raw(kind="user_input", payload={"text": 5}),
        _raw(
            kind="tool_outcome", payload={"call_id": "c1", "status": "success"}, task_budget={"cost": "1.5"}
        ),
    ],
    ids=["string-for-int", "true-for-1", "number-for-string", "string-for-number"],
)
def test_decode_event_is_strict_as_the_event_schema_types_fields(raw: bytes) -> None:
    with pytest.raises(EventDecodeError) as err:
        decode_event(raw, max_bytes=1000)
    assert err.value.code is ErrorCode.INVALID_EVENT


@pytest.mark.parametrize(
    ("client_ts", "taken"),
    [
        ("2026-01-31T09:30:00Z", True),
        ("2026-01-31t09:30:00.123456789+05:30", True),
        ("2026-01-31T09:30:00", False),
        ("2026-01-31T09:30Z", False),
        ("1769851800", False),
        ("2026-02-30T00:00:00Z", False),
    ],
)
def test_decode_event_takes_client_ts_as_rfc_3339_with_seconds_and_an_offset_only(
    client_ts: str, taken: bool
) -> None:
    raw = _raw(kind="user_input", payload={"text": "x"}, client_ts=client_ts)
    if taken:
        ts = decode_event(raw, max_bytes=1000).client_ts
        assert ts is not None and ts.tzinfo is not None
    else:
        with pytest.raises(EventDecodeError, match="client_ts"):
            decode_event(raw, max_bytes=1000)


def test_a_naive_time_given_in_python_is_utc_so_what_the_client_sends_has_an_offset() -> None:
    request = SearchRequest(session_id="s1", query="x", since=datetime(2026, 1, 31, 9, 30))
    assert request.since == datetime(2026, 1, 31, 9, 30, tzinfo=timezone.utc)
    assert json.loads(request.model_dump_json())["since"] == "2026-01-31T09:30:00Z"


def test_thread_ids_are_two_subject_tokens_and_round_trip() -> None:
    assert thread_id_of("run-1", "main") == "run-1.main"
    assert split_thread_id("run-1.main") == ("run-1", "main")
    assert events_subject("acme", "s1", "run-1.main") == "ctx.events.acme.s1.run-1.main"
    for bad in ("run.1.main", "run*", "a b.main", ".main", "run."):
        with pytest.raises(ValueError):
            split_thread_id(bad)


def test_every_subject_a_runtime_uses_names_its_tenant_and_a_bad_tenant_is_refused() -> None:
    assert prepare_subject("acme", "run-1.main") == "ctx.prepare.acme.run-1.main"
    assert inspect_subject("acme", "run-1.main") == "ctx.inspect.acme.run-1.main"
    assert tenant_subject("ctx.read", "acme") == "ctx.read.acme"
    for bad in ("a.b", "*", ">", "", "a b"):
        with pytest.raises(ValueError, match="tenant"):
            tenant_subject("ctx.read", bad)
        with pytest.raises(ValueError, match="tenant"):
            events_subject(bad, "s1", "run-1.main")


def test_partition_helpers_agree_with_each_other() -> None:
    src, dest = partition_transform(16)
    assert src == "ctx.events.*.*.*.*"
    assert dest == "ctx.p.{{partition(16,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}"
    assert partition_filter(3) == "ctx.p.3.>"
    assert parse_stored_subject("ctx.p.3.acme.s1.run-1.main") == StoredSubject("acme", "s1", "run-1.main")
    # Stored before subjects carried a tenant: still read, as the default tenant's.
    assert parse_stored_subject("ctx.p.3.s1.run-1.main") == StoredSubject("default", "s1", "run-1.main")
    assert thread_from_partitioned_subject("ctx.p.3.acme.s1.run-1.main") == "run-1.main"
    assert thread_from_partitioned_subject("ctx.events.acme.s1.run-1.main") is None
    assert parse_stored_subject("ctx.p.3.s1.main") is None
    spread = {partition_of(f"session-{i}", partitions=16) for i in range(200)}
    assert spread == set(range(16))


def test_prepare_request_needs_a_budget_source_and_at_most_one_profile() -> None:
    with pytest.raises(ValidationError, match="budget"):
        PrepareRequest(session_id="s", run_id="r", instance_id="main")
    with pytest.raises(ValidationError, match="not both"):
        PrepareRequest(
            session_id="s",
            run_id="r",
            instance_id="main",
            model_profile="gpt-4o",
            profile=ModelProfile(name="x", context_window=1000),
        )


def test_model_profile_input_budget_is_min_of_limit_and_window_minus_reserve_and_margin() -> None:
    assert (
        ModelProfile(name="m", context_window=1000, output_reserve=200, safety_margin=50).input_budget == 750
    )
    assert (
        ModelProfile(name="m", context_window=1000, input_limit=600, output_reserve=200).input_budget == 600
    )
    with pytest.raises(ValidationError, match="exceed"):
        ModelProfile(name="m", context_window=100, output_reserve=100)
