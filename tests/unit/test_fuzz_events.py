"""Fuzzing the wire: any bytes decode to an event or a typed error, and what is accepted is storable.

Values are JSON-ish with the hostile ones mixed in (NUL, lone surrogates, integers past 64 bits and
past Python's 4,300 digits, NaN / Infinity / ``1e999``, deep nesting, large strings), for every
event kind. Accepted events must plan without raising, and everything the plan (and every dead
letter) would hand PostgreSQL must be text and JSON that ``text`` and ``jsonb`` accept.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from contracts import EVENT_KINDS, ErrorCode, EventDecodeError, decode_event
from services.core.ledger import BatchPlan, Incoming, LedgerReads, RecordingLimits, decode_batch, plan_batch
from services.core.tokens import ENCODINGS, counter_for

COUNTERS = {n: counter_for(n) for n in ENCODINGS}
LIMITS = RecordingLimits()
DECODE_CODES = {
    ErrorCode.PAYLOAD_TOO_LARGE,
    ErrorCode.INVALID_ENCODING,
    ErrorCode.MALFORMED_JSON,
    ErrorCode.UNKNOWN_EVENT_KIND,
    ErrorCode.INVALID_EVENT,
}
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# json.dumps cannot write these literals (or would write them differently), so strategies emit a
# placeholder string that is spliced into the encoded text as the raw literal.
_RAW_LITERALS = {
    "\u2063DEEP\u2063": "[" * 1000 + "]" * 1000,
    "\u2063BIGINT\u2063": "9" * 5000,
    "\u2063NEGBIGINT\u2063": "-" + "9" * 5000,
    "\u2063OVERFLOW\u2063": "1e999",
    "\u2063INT64P1\u2063": str(2**63),
}

hostile_strings = st.one_of(
    st.sampled_from(["\x00", "a\x00b", "\ud800", "\udfff", "x\ud83d", "\ud83d\ude00", "\\u0000", "é\u2028"]),
    st.integers(min_value=1_000, max_value=20_000).map(lambda n: "x" * n),
)
hostile_scalars = st.one_of(
    st.integers(min_value=2**63 - 2, max_value=2**63 + 2),
    st.integers(min_value=-(2**63) - 2, max_value=-(2**63) + 2),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_strings,
    st.sampled_from(sorted(_RAW_LITERALS)),
)


def _nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def _family(
    hostile: bool,
) -> tuple[st.SearchStrategy[Any], st.SearchStrategy[Any], dict[str, st.SearchStrategy[dict[str, Any]]]]:
    """Strategies for texts, JSON values and every kind's payload; ``hostile`` mixes in the bad values."""
    texts: st.SearchStrategy[Any] = st.text(max_size=30)
    scalars: st.SearchStrategy[Any] = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        texts,
    )
    if hostile:
        texts = st.one_of(texts, hostile_strings)
        scalars = st.one_of(scalars, hostile_scalars)
    values: st.SearchStrategy[Any] = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
        max_leaves=12,
    )
    if hostile:
        values = st.one_of(values, st.builds(_nest, scalars, st.integers(min_value=50, max_value=80)))
    identifiers = st.one_of(st.from_regex(r"\A[A-Za-z0-9_-]{1,12}\Z"), texts)

    def sometimes(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        """Mostly a plausible value for the field, sometimes anything at all."""
        return st.one_of(valid, valid, valid, values) if hostile else valid

    def maybe(*required: str, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
        """The payload's fields: ``required`` ones always present (unless hostile), the rest optional."""
        always = {name: sometimes(s) for name, s in fields.items() if name in required and not hostile}
        return st.fixed_dictionaries(
            always, optional={n: sometimes(s) for n, s in fields.items() if n not in always}
        )

    tool_calls = st.lists(
        st.fixed_dictionaries(
            {"call_id": sometimes(identifiers), "name": sometimes(identifiers)},
            optional={
                "args": sometimes(st.dictionaries(texts, values, max_size=3)),
                "operation_id": identifiers,
            },
        ),
        max_size=3,
        unique_by=lambda c: str(c["call_id"]),
    )
    patch_ops = st.lists(
        st.fixed_dictionaries(
            {
                "op": sometimes(
                    st.sampled_from(["set", "clear", "append", "remove", "increment", "replace_if"])
                ),
                "path": sometimes(st.sampled_from(["task.goal", "item:1.location", "plan.steps"])),
            },
            optional={"value": values, "expected": values, "unknown": st.booleans()},
        ),
        min_size=1,
        max_size=3,
    )
    payloads = {
        "system": maybe("text", text=texts),
        "user_input": maybe("text", text=texts, intent=st.sampled_from(["question", "supplement"])),
        "assistant_message": maybe(
            text=texts, tool_calls=tool_calls, purpose=st.sampled_from(["action", "completion"])
        ),
        "tool_outcome": maybe(
            "call_id",
            call_id=identifiers,
            status=st.sampled_from(["success", "error", "timeout", "unknown"]),
            text=texts,
            external_ref=texts,
        ),
        "resource_activated": maybe(
            "resource_id", resource_id=identifiers, revision=texts, uri=texts, title=texts, text=texts
        ),
        "child_result": maybe(
            "child_instance_id",
            child_instance_id=identifiers,
            status=st.sampled_from(["completed", "failed", "cancelled"]),
            conclusion=texts,
            evidence_refs=st.lists(texts, max_size=2),
            artifact_refs=st.lists(texts, max_size=2),
            unresolved=st.lists(texts, max_size=2),
        ),
        "run_status": maybe(
            "status",
            status=st.sampled_from(["completed", "failed", "cancelled", "interrupted"]),
            reason=texts,
        ),
        "context_export": maybe(
            "refs",
            refs=st.lists(
                st.fixed_dictionaries({"thread_id": st.just("r-parent.main"), "seq": scalars}),
                min_size=1,
                max_size=2,
            ),
            note=texts,
        ),
        "context_reset": maybe(reason=texts),
        "state_patch": maybe(
            "source",
            "ops",
            source=st.sampled_from(["user", "model_proposal", "orchestrator"]),
            ops=patch_ops,
            based_on_version=st.dictionaries(texts, scalars, max_size=2),
            evidence=st.lists(texts, max_size=2),
        ),
        "operation_reconcile": maybe(
            "operation_id",
            "status",
            operation_id=identifiers,
            status=st.sampled_from(["success", "failed"]),
            external_ref=texts,
            evidence=texts,
        ),
        "phase_change": maybe(
            "phase",
            phase=texts,
            expected_steps=st.integers(min_value=-2, max_value=200_000),
            source=st.sampled_from(["runtime", "model_proposal", "orchestrator"]),
            note=texts,
        ),
    }
    assert set(payloads) == set(EVENT_KINDS), "a new event kind needs a fuzz strategy"
    return texts, values, payloads


FAMILIES = {hostile: _family(hostile) for hostile in (False, True)}
json_values = FAMILIES[True][1]

timestamps = st.builds(
    lambda dt, minutes: dt.replace(tzinfo=timezone(timedelta(minutes=minutes))).isoformat(),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31)),
    st.integers(min_value=-14 * 60, max_value=14 * 60),
)


@st.composite
def event_bodies(draw: st.DrawFn, session_id: str = "s-fuzz", run_id: str = "r-fuzz") -> dict[str, Any]:
    """An event-shaped JSON object of any kind: half plausible, half with hostile values mixed in."""
    hostile = draw(st.booleans())
    texts, values, payloads = FAMILIES[hostile]
    known = st.sampled_from(EVENT_KINDS)
    kind = draw(st.one_of(known, known, known, texts) if hostile else known)
    key = st.from_regex(r"\Ak-[a-z0-9]{1,8}\Z")
    body: dict[str, Any] = {
        "kind": kind,
        "event_key": draw(st.one_of(key, key, key, values) if hostile else key),
        "session_id": session_id,
        "run_id": run_id,
        "instance_id": "main",
        "payload": draw(payloads.get(kind, st.just({}))),
    }
    optional = {"client_ts": timestamps, "principal_id": st.from_regex(r"\A[a-z0-9]{1,8}\Z")}
    body.update(draw(st.fixed_dictionaries({}, optional=optional)))
    return body


def encode_body(body: Any) -> bytes:
    """The JSON bytes of ``body`` with the raw literals spliced in (lone surrogates escaped,
    as on the wire)."""
    text = json.dumps(body, ensure_ascii=True)
    for placeholder, literal in _RAW_LITERALS.items():
        text = text.replace(json.dumps(placeholder, ensure_ascii=True), literal)
    return text.encode("ascii")


def incoming_of(raw: bytes, session_id: str = "s-fuzz", run_id: str = "r-fuzz", seq: int = 1) -> Incoming:
    return Incoming(f"ctx.p.0.{session_id}.{run_id}.main", raw, seq)


def assert_storable_text(value: str | None) -> None:
    """What PostgreSQL ``text`` accepts: valid UTF-8 with no NUL."""
    if value is not None:
        assert "\x00" not in value
        value.encode("utf-8")


def assert_storable_json(value: Any) -> None:
    """What ``jsonb`` accepts from Python's encoder: no NaN / Infinity, no NUL, no lone surrogate."""
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-finite number {constant} would be refused by jsonb")

    stack = [json.loads(text, parse_constant=refuse)]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            assert_storable_text(node)
        elif isinstance(node, dict):
            for key in node:
                assert_storable_text(key)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _plan_one(raw: bytes) -> BatchPlan:
    return plan_batch(decode_batch([incoming_of(raw)], LIMITS), LedgerReads({}, {}, {}), LIMITS, COUNTERS)


def _assert_plan_storable(plan: BatchPlan) -> None:
    for record in plan.records:
        assert_storable_json(record.payload_json)
        for text in (record.text, record.view_text, record.mask_text):
            assert_storable_text(text)
    for call in plan.calls:
        assert_storable_json(dict(call.args))
    for rejection in plan.rejections:
        assert_storable_text(rejection.reason)
        assert_storable_json(rejection.details)


@FUZZ
@given(event_bodies())
def test_decode_event_gives_an_event_or_a_known_code_and_accepted_events_plan_to_storable_writes(
    body: dict[str, Any],
) -> None:
    raw = encode_body(body)
    try:
        decode_event(raw, max_bytes=LIMITS.max_event_bytes)
    except EventDecodeError as err:
        event(f"refused: {err.code.value} {err.details.get('limit', '')}".strip())
        assert err.code in DECODE_CODES
        # The dead letter of a refused event is stored too: its reason and details must be storable.
        assert_storable_text(err.message)
        assert_storable_json(err.details)
        return
    plan = _plan_one(raw)
    event("planned: recorded" if plan.records else "planned: rejected")
    _assert_plan_storable(plan)


@FUZZ
@given(st.one_of(st.binary(max_size=200), st.builds(encode_body, json_values)))
def test_decode_event_of_arbitrary_bytes_never_raises_anything_but_a_decode_error(raw: bytes) -> None:
    try:
        decode_event(raw, max_bytes=LIMITS.max_event_bytes)
    except EventDecodeError as err:
        assert err.code in DECODE_CODES
        assert_storable_text(err.message)
        assert_storable_json(err.details)
