"""The wire's JSON limits: each hostile input is a typed decode error naming its limit;
the limit itself passes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contracts import ErrorCode, EventDecodeError, decode_event
from contracts.events import JSON_INT_MAX, JSON_INT_MIN, MAX_JSON_DEPTH

ENVELOPE = '"event_key":"k1","session_id":"s1","run_id":"r1","instance_id":"main"'
MAX_BYTES = 1 << 20


def _user(text_json: str) -> bytes:
    """A user_input whose text is the given JSON string literal, written as is (escapes kept)."""
    return ('{"kind":"user_input",%s,"payload":{"text":%s}}' % (ENVELOPE, text_json)).encode()


def _args(value_json: str) -> bytes:
    """An assistant message with one tool call whose argument ``a`` is the given raw JSON value."""
    call = '{"call_id":"c1","name":"ls","args":{"a":%s}}' % value_json
    return ('{"kind":"assistant_message",%s,"payload":{"tool_calls":[%s]}}' % (ENVELOPE, call)).encode()


# Levels above the argument value: event object, payload, tool_calls array, call object, args object.
_ARG_DEPTH = 5


def _nested_args(levels: int) -> bytes:
    """Arguments nested so that the whole event is ``levels`` containers deep."""
    inner = levels - _ARG_DEPTH
    return _args("[" * inner + "1" + "]" * inner)


def _decode_error(raw: bytes) -> EventDecodeError:
    with pytest.raises(EventDecodeError) as err:
        decode_event(raw, max_bytes=MAX_BYTES)
    return err.value


@pytest.mark.parametrize(
    ("raw", "code", "limit", "says"),
    [
        (_user('"before\\u0000after"'), ErrorCode.INVALID_ENCODING, "no_nul", "U+0000"),
        (_user('"lone \\ud800 high"'), ErrorCode.INVALID_ENCODING, "no_lone_surrogates", "lone surrogate"),
        (_user('"lone \\uDC00 low"'), ErrorCode.INVALID_ENCODING, "no_lone_surrogates", "lone surrogate"),
        (_nested_args(1000), ErrorCode.INVALID_EVENT, "MAX_JSON_DEPTH", "MAX_JSON_DEPTH = 64"),
        (_args("9" * 5000), ErrorCode.INVALID_EVENT, "JSON_INT_MAX", "signed 64-bit"),
        (_args("1e999"), ErrorCode.INVALID_EVENT, "finite_numbers", "not finite"),
        (_args("NaN"), ErrorCode.INVALID_EVENT, "finite_numbers", "not finite"),
    ],
    ids=["nul", "lone-high-surrogate", "lone-low-surrogate", "depth-1000", "int-5000-digits", "1e999", "nan"],
)
def test_decode_event_refuses_each_hostile_input_with_its_code_and_names_the_limit(
    raw: bytes, code: ErrorCode, limit: str, says: str
) -> None:
    err = _decode_error(raw)
    assert (err.code, err.details["limit"]) == (code, limit)
    assert says in err.message


@pytest.mark.parametrize("constant", ["Infinity", "-Infinity", "-1e999"])
def test_decode_event_refuses_every_non_finite_spelling(constant: str) -> None:
    err = _decode_error(_args(constant))
    assert (err.code, err.details["limit"]) == (ErrorCode.INVALID_EVENT, "finite_numbers")


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        (('{"kind":"user_input","event_key":"e2",%s,"payload":{}}' % ENVELOPE).encode(), "event_key"),
        (_user('"x","intent":"question","text":"y"'), "text"),
        (_args('{"path":"a","deep":[{"k":1,"k":1}]}'), "k"),
    ],
    ids=["envelope", "payload", "deep-in-args-same-value"],
)
def test_decode_event_refuses_a_key_repeated_in_any_object_and_names_it(raw: bytes, key: str) -> None:
    # Readers disagree on which of two equal keys wins (json.loads keeps the last): the fleet takes neither.
    err = _decode_error(raw)
    assert (err.code, err.details) == (ErrorCode.INVALID_EVENT, {"limit": "unique_keys", "key": key})
    assert f"key '{key}' appears twice" in err.message


def test_decode_event_names_a_repeated_key_escaped_when_it_holds_what_a_reason_may_not() -> None:
    err = _decode_error(_args('{"k\\u0000":1,"k\\u0000":2}'))
    assert err.details == {"limit": "unique_keys", "key": "k\\x00"}


def test_decode_event_refuses_nul_and_surrogates_in_object_keys_too() -> None:
    assert _decode_error(_args('{"k\\u0000ey": 1}')).details["limit"] == "no_nul"
    assert _decode_error(_args('{"k\\ud83dey": 1}')).details["limit"] == "no_lone_surrogates"


def test_decode_event_refuses_nul_in_an_envelope_field_before_reading_the_kind() -> None:
    raw = b'{"kind":"tel\\u0000epathy",' + ENVELOPE.encode() + b',"payload":{}}'
    assert _decode_error(raw).code is ErrorCode.INVALID_ENCODING


def test_decode_event_accepts_nesting_exactly_at_the_depth_limit() -> None:
    event = decode_event(_nested_args(MAX_JSON_DEPTH), max_bytes=MAX_BYTES)
    assert event.kind == "assistant_message"
    err = _decode_error(_nested_args(MAX_JSON_DEPTH + 1))
    assert err.details == {"limit": "MAX_JSON_DEPTH", "max_depth": MAX_JSON_DEPTH}


def test_decode_event_accepts_the_signed_64_bit_bounds_and_refuses_one_beyond() -> None:
    for value in (JSON_INT_MAX, JSON_INT_MIN, 0, -1):
        event = decode_event(_args(str(value)), max_bytes=MAX_BYTES)
        assert event.payload.tool_calls[0].args == {"a": value}  # type: ignore[union-attr]
    assert _decode_error(_args(str(JSON_INT_MAX + 1))).details["limit"] == "JSON_INT_MAX"
    assert _decode_error(_args(str(JSON_INT_MIN - 1))).details["limit"] == "JSON_INT_MIN"


def test_decode_event_accepts_large_finite_floats_and_surrogate_pairs() -> None:
    event = decode_event(_args("1.7976931348623157e308"), max_bytes=MAX_BYTES)
    assert event.payload.tool_calls[0].args == {"a": 1.7976931348623157e308}  # type: ignore[union-attr]
    emoji = decode_event(_user('"ok \\ud83d\\ude00 and \\\\u0000 as plain text"'), max_bytes=MAX_BYTES)
    assert emoji.payload.text == "ok \U0001f600 and \\u0000 as plain text"  # type: ignore[union-attr]


def test_decode_event_accepts_wide_but_shallow_json_with_many_brackets() -> None:
    # Many brackets side by side are not depth: only the walk, not the bracket count, decides.
    args = json.dumps({"rows": [[i, [i]] for i in range(200)]})
    event = decode_event(_args(args), max_bytes=MAX_BYTES)
    value: Any = event.payload.tool_calls[0].args["a"]  # type: ignore[union-attr]
    assert len(value["rows"]) == 200


def test_decode_event_refuses_a_client_ts_that_does_not_exist_in_utc_and_accepts_the_edges_that_do() -> None:
    def with_ts(ts: str) -> bytes:
        return ('{"kind":"user_input",%s,"client_ts":"%s","payload":{"text":"x"}}' % (ENVELOPE, ts)).encode()

    for ts in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        assert _decode_error(with_ts(ts)).details == {"limit": "client_ts_range"}
    for ts in ("0001-01-01T00:00:00+00:00", "0001-01-01T01:00:00+01:00", "9999-12-31T23:59:59+00:00"):
        assert decode_event(with_ts(ts), max_bytes=MAX_BYTES).client_ts is not None
