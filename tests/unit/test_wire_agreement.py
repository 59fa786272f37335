"""The schemas and the fleet accept the same messages: one corpus, two judges, compared per message.

The fleet's judge is its own decoder of each message it receives (``decode_event`` for events,
``parse_body`` for requests, ``validate_wire`` for a hook's reply). The other is a strict JSON
parser (no BOM, no ``NaN``) under ``jsonschema``'s Draft 2020-12 validator over the generated
schemas, with ``date-time`` format checks and ECMA-262 patterns, as JSON Schema defines them.

The corpus is every valid message below, and each one broken in every place a class of mistake
fits: a wrong type, a string for an integer, a field missing, null or unknown, an unknown kind, a
repeated key, U+0000, a lone surrogate, too deep, an integer out of range, a number that is not
finite, oversize… For most classes the two must answer alike. The rest are listed in
``DECODER_ONLY`` (and in docs/wire.md): rules JSON Schema cannot state, where the fleet refuses
what a schema validator passes, never the other way round.
"""

from __future__ import annotations

import calendar
import copy
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from pydantic import BaseModel
from pydantic import ValidationError as PydanticError

from contracts import (
    EventDecodeError,
    CompactRequest,
    ContextPolicy,
    FinalCheckRequest,
    ContextRequest,
    InspectRequest,
    OperationStatusRequest,
    PrepareRequest,
    ReadRequest,
    SearchRequest,
    ToolCatalog,
    decode_event,
)
from contracts.branches import ExportRequest, ForkRequest
from contracts.hook_protocol import HookReply
from contracts.hooks import HookSet
from contracts.wire_json import JSON_INT_MAX, WireJsonError, validate_wire
from infra.asyncapi import CHANNELS
from infra.wire_schema import WireMessage, message_schema
from contracts.exceptions import InvalidRequest
from workers.replies import parse_body

ROOT = Path(__file__).resolve().parents[2]
MAX_EVENT_BYTES = 8_192

# Where the fleet refuses what a schema validator accepts: the class, and why JSON Schema cannot say it.
# docs/wire.md lists the same classes ("What only the fleet checks").
DECODER_ONLY = {
    "duplicate_keys": "a validator sees the parsed object, where one of two equal keys is already gone",
    "nul": "U+0000 is valid JSON text; PostgreSQL text cannot hold it",
    "lone_surrogate": "an escaped lone surrogate is valid JSON syntax, not Unicode",
    "too_deep": "JSON Schema has no depth limit for free-form JSON (tool arguments)",
    "int_out_of_range": "free-form JSON has no type to bound (typed integers carry the bounds)",
    "number_overflow": "1e999 is a valid JSON number; no double holds it",
    "integer_with_fraction": "for JSON Schema 8000.0 is the integer 8000; the fleet reads integers "
    "as typed languages do",
    "oversize": "JSON Schema does not measure the bytes of a message",
    "client_ts_range": "a time whose UTC instant is outside years 1..9999 is valid RFC 3339",
    "cross_field": "JSON Schema cannot compare two values or find a repeated name",
}


# --- The fleet's decoders ----------------------------------------------------------------------------


def _request(model: type[BaseModel]) -> Callable[[bytes], object]:
    return lambda raw: parse_body(model, raw)


FLEET: dict[str, Callable[[bytes], object]] = {
    "Event": lambda raw: decode_event(raw, max_bytes=MAX_EVENT_BYTES),
    # workers.hook_runner reads a hook's answer with exactly this.
    "HookReply": lambda raw: validate_wire(HookReply, raw),
    **{
        m.__name__: _request(m)
        for m in (
            PrepareRequest,
            InspectRequest,
            ContextRequest,
            ReadRequest,
            SearchRequest,
            ContextPolicy,
            ToolCatalog,
            HookSet,
            OperationStatusRequest,
            ForkRequest,
            ExportRequest,
            CompactRequest,
            FinalCheckRequest,
        )
    },
}


def fleet_accepts(name: str, raw: bytes) -> bool:
    try:
        FLEET[name](raw)
    except (EventDecodeError, InvalidRequest, WireJsonError, PydanticError):
        return False
    return True


# --- The schemas' judge ------------------------------------------------------------------------------

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-]([0-9]{2}):([0-9]{2}))"
)
_FORMATS = FormatChecker()


@_FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    """RFC 3339 §5.6 ``date-time`` (``jsonschema`` checks it only with an optional package)."""
    if not isinstance(value, str):
        return True
    m = _RFC3339.fullmatch(value)
    if m is None:
        return False
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    offset_ok = m.group(9) is None or (int(m.group(9)) <= 23 and int(m.group(10)) <= 59)
    days = calendar.monthrange(year, month)[1] if 1 <= month <= 12 else 0
    return 1 <= day <= days and hour <= 23 and minute <= 59 and second <= 60 and offset_ok


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    # JSON Schema patterns are ECMA-262, where "$" ends the input; Python's "$" also matches before a
    # final newline, so jsonschema alone would pass "s1\n" as an id that ajv and the fleet refuse.
    if not validator.is_type(instance, "string"):
        return
    python = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern
    if re.search(python, instance) is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


_Strict = validators.extend(Draft202012Validator, {"pattern": _ecma_pattern})


def _not_json(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _received() -> dict[str, WireMessage]:
    """What the fleet receives: what runtimes send it, and what a hook answers it."""
    out: dict[str, WireMessage] = {}
    for channel in CHANNELS:
        if channel.internal:
            continue
        if channel.action == "receive" and channel.message is not None:
            out[channel.message.name] = channel.message
        elif channel.action == "send":
            out.update({r.name: r for r in channel.replies})
    return out


RECEIVED = _received()
SCHEMAS = {name: _Strict(message_schema(m), format_checker=_FORMATS) for name, m in RECEIVED.items()}


def schema_accepts(name: str, raw: bytes) -> bool:
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_not_json)
    except ValueError:  # not UTF-8, not JSON (a BOM, NaN): no validator gets to see it
        return False
    return bool(SCHEMAS[name].is_valid(value))


# --- JSON text, written by hand where json.dumps cannot -----------------------------------------------


@dataclass(frozen=True)
class Raw:
    """A literal written as is: NaN, 1e999, 2**63, an escaped lone surrogate."""

    text: str


@dataclass(frozen=True)
class Pairs:
    """An object written pair by pair, so a key may repeat."""

    items: tuple[tuple[str, Any], ...]


def text_of(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{text_of(v)}" for k, v in value.items) + "}"
    if isinstance(value, dict):
        return text_of(Pairs(tuple(value.items())))
    if isinstance(value, list):
        return "[" + ",".join(text_of(v) for v in value) + "]"
    return json.dumps(value)


def _nodes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, (*path, i))


def _with(body: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    out = copy.copy(body)
    out[path[0]] = _with(body[path[0]], path[1:], new)
    return out


def _without(body: Any, path: tuple[Any, ...]) -> Any:
    out = copy.copy(body)
    if len(path) == 1:
        del out[path[0]]
        return out
    out[path[0]] = _without(body[path[0]], path[1:])
    return out


# --- The corpus ---------------------------------------------------------------------------------------

_ENVELOPE = {"schema_version": 1, "session_id": "s1", "run_id": "r1", "instance_id": "main"}


def _event(key: str, kind: str, payload: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    return {**_ENVELOPE, "event_key": key, "kind": kind, "payload": payload, **envelope}


_BUDGET = {"total_tokens": 90_000, "cost": 2.5, "hard": False}
EVENTS = [
    _event("e1", "system", {"text": "be brief"}, client_ts="2026-01-31T09:30:00Z", principal_id="p1"),
    _event("e2", "user_input", {"text": "fix the build", "intent": "question"}, task_budget=_BUDGET),
    _event(
        "e3",
        "assistant_message",
        {
            "text": "reading",
            "tool_calls": [
                {"call_id": "c1", "name": "read", "args": {"path": "a.txt", "lines": 40, "deep": {}}}
            ],
            "usage": {"input_tokens": 900, "output_tokens": 12, "cost": 0.01},
        },
    ),
    _event("e4", "tool_outcome", {"call_id": "c1", "status": "success", "text": "ok", "external_ref": "x-1"}),
    _event("e5", "resource_activated", {"resource_id": "skill:git", "revision": "3", "text": "use git"}),
    _event("e6", "child_result", {"child_instance_id": "kid", "status": "completed", "evidence_refs": ["r"]}),
    _event("e7", "run_status", {"status": "completed", "reason": "done"}),
    _event("e8", "context_export", {"refs": [{"thread_id": "r0.main", "seq": 3}], "note": "see"}),
    _event("e9", "context_reset", {"reason": "new task"}),
    _event(
        "e10",
        "state_patch",
        {
            "source": "user",
            "ops": [{"op": "set", "path": "goal:1.text", "value": {"v": [1, 2.5, None, True]}}],
            "based_on_version": {"goal:1": 2},
        },
    ),
    _event("e11", "operation_reconcile", {"operation_id": "op-1", "status": "success", "evidence": "paid"}),
    _event("e12", "phase_change", {"phase": "verify", "expected_steps": 4, "source": "runtime"}),
]
_WHO = {"session_id": "s1", "principal_id": "p1"}
REQUESTS: dict[str, list[dict[str, Any]]] = {
    "PrepareRequest": [
        {
            **_WHO,
            "schema_version": 1,
            "run_id": "r1",
            "instance_id": "main",
            "purpose": "action",
            "budget_tokens": 8000,
            "profile": {
                "name": "m",
                "context_window": 16_000,
                "output_reserve": 1_000,
                "encoding": "estimate",
            },
            "model_profile": None,
            "tools": [{"name": "read", "description": "read a file", "parameters": {"type": "object"}}],
            "after_event_key": "e4",
            "after_event_hash": "0f" * 32,
            "wait_ms": 2_000,
            "usage": {"response_event_key": "e3", "input_tokens": 900, "output_tokens": 12},
            "evidence": [{"thread_id": "r1.main", "seq": 2, "start_line": 1, "end_line": 4}],
            "context_tools": True,
            "forecast": {"expected_steps": 3, "tool_calls": 2},
            "task_budget": {"model_calls": 30},
        },
        {"session_id": "s1", "run_id": "r1", "instance_id": "main", "model_profile": "gpt-4o"},
    ],
    "InspectRequest": [{"schema_version": 1, "limit": 20}],
    "ContextRequest": [{}, {"model_profile": "gpt-4o", "budget_tokens": 4000}],
    "ReadRequest": [{**_WHO, "ref": "ctx://record/r1.main/2", "line": 3, "lines": 10}],
    "SearchRequest": [
        {
            **_WHO,
            "query": "build",
            "run_id": "r1",
            "kinds": ["tool_outcome"],
            "since": "2026-01-31T09:30:00.5+01:00",
            "until": "2026-02-01T00:00:00Z",
            "limit": 5,
        }
    ],
    "ContextPolicy": [
        {
            "name": "tight",
            "model_profile": None,
            "budget_tokens": 6_000,
            "compaction": {"triggers": {"context_ratio": 0.8, "user_turns": 3}, "keep_recent_groups": 1},
            "window": {"strategy": "rollover", "levels": {"yellow": 0.5, "orange": 0.7, "red": 0.9}},
        }
    ],
    "ToolCatalog": [
        {
            "release": "rel-1",
            "paths": [{"pattern": "order:{id}.status", "kind": "business_fact"}],
            "tools": [
                {
                    "name": "ship",
                    "input_schema": {"type": "object", "required": ["id"]},
                    "effects": [{"path": "order:{args.id}.status", "op": "set", "value": "shipped"}],
                    "idempotency": "required",
                }
            ],
        }
    ],
    "HookSet": [
        {
            "release": "rel-1",
            "hooks": [
                {
                    "name": "policy",
                    "version": "2",
                    "point": "context.prepare.before",
                    "subject": "hooks.default.policy",
                    "timeout_ms": 800,
                    "grants": ["material"],
                }
            ],
        }
    ],
    "OperationStatusRequest": [{**_WHO, "operation_id": "op-1"}],
    "ForkRequest": [{**_WHO, "at_seq": 4, "new_session_id": "s2"}],
    "ExportRequest": [{"after_seq": 2, "offset": 0, "max_bytes": 65_536}],
    "CompactRequest": [{**_WHO, "run_id": "r1", "instance_id": "main"}],
    "FinalCheckRequest": [
        {
            "run_id": "r1",
            "instance_id": "main",
            "prepared_id": "pc-1",
            "attempt": 2,
            "request": {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "n": 1},
            "additions": [{"source": "redactor@1", "category": "material", "text": "note"}],
        }
    ],
    "HookReply": [
        {"decision": "continue"},
        {
            "decision": "patch",
            "patch": {
                "add": [{"category": "material", "title": "policy", "text": "refunds need approval"}],
                "narrow_to": {"from_seq": 1, "to_seq": 4},
                "summary_target_tokens": 200,
            },
        },
    ],
}
# Every message names its version: the one field all share, and the one pydantic would take `true` for.
VALID: dict[str, list[Any]] = {
    name: [{"schema_version": 1, **body} for body in bodies]
    for name, bodies in {"Event": EVENTS, **REQUESTS}.items()
}


@dataclass(frozen=True)
class Case:
    message: str
    cls: str
    what: str
    raw: bytes


def _case(message: str, cls: str, what: str, body: Any) -> Case:
    return Case(message, cls, what, text_of(body).encode())


def _mutations(message: str, body: Any) -> Iterator[Case]:
    """``body`` broken in every place each class of mistake fits."""
    yield _case(message, "valid", "as is", body)
    for path, node in _nodes(body):
        at = "/".join(map(str, path)) or "(root)"
        if path:
            yield _case(message, "null", at, _with(body, path, None))
            yield _case(message, "wrong_type", f"{at} as an object", _with(body, path, {"x": 1}))
            yield _case(message, "too_deep", at, _with(body, path, Raw("[" * 70 + "1" + "]" * 70)))
            if isinstance(path[-1], str):
                yield _case(message, "missing_field", at, _without(body, path))
        if isinstance(node, dict):
            yield _case(message, "unknown_field", at, _with(body, path, {**node, "zz_unknown": 1}))
            if node:
                first, value = next(iter(node.items()))
                for twin in (value, None):
                    repeated = Pairs((*node.items(), (first, twin)))
                    yield _case(message, "duplicate_keys", f"{at}/{first} again", _with(body, path, repeated))
        elif isinstance(node, str):
            yield _case(message, "wrong_type", f"{at} as a number", _with(body, path, 5))
            yield _case(message, "empty_string", at, _with(body, path, ""))
            yield _case(message, "trailing_newline", at, _with(body, path, node + "\n"))
            yield _case(message, "nul", at, _with(body, path, node + "\x00"))
            yield _case(
                message, "lone_surrogate", at, _with(body, path, Raw(json.dumps(node)[:-1] + '\\ud800"'))
            )
        elif isinstance(node, bool):
            yield _case(message, "wrong_type", f"{at} as 1", _with(body, path, 1))
            yield _case(message, "wrong_type", f"{at} as a string", _with(body, path, str(node).lower()))
        elif isinstance(node, int):
            yield _case(message, "string_for_int", at, _with(body, path, str(node)))
            yield _case(message, "wrong_type", f"{at} as true", _with(body, path, True))
            yield _case(message, "integer_with_fraction", at, _with(body, path, Raw(f"{node}.0")))
            yield _case(message, "out_of_bounds", f"{at} negative", _with(body, path, -1))
            yield _case(message, "int_out_of_range", at, _with(body, path, Raw(str(JSON_INT_MAX + 1))))
            yield _case(message, "not_json", f"{at} NaN", _with(body, path, Raw("NaN")))
            yield _case(message, "number_overflow", at, _with(body, path, Raw("1e999")))
        elif isinstance(node, float):
            yield _case(message, "string_for_number", at, _with(body, path, str(node)))
            yield _case(message, "not_json", f"{at} Infinity", _with(body, path, Raw("Infinity")))
            yield _case(message, "number_overflow", at, _with(body, path, Raw("-1e999")))


def _whole(message: str, body: Any) -> Iterator[Case]:
    """The message as a whole: not an object, not JSON, not UTF-8."""
    text = text_of(body).encode()
    for what, raw in (
        ("an array", b"[]"),
        ("a string", b'"x"'),
        ("null", b"null"),
        ("empty", b""),
        ("truncated", text[:-1]),
        ("a BOM first", b"\xef\xbb\xbf" + text),
        ("a byte that is not UTF-8", text[:-1] + b"\xff}"),
        ("trailing data", text + b"{}"),
    ):
        yield Case(message, "not_a_message", what, raw)


def _kinds() -> Iterator[Case]:
    base = EVENTS[1]
    yield _case("Event", "unknown_kind", "telepathy", {**base, "kind": "telepathy"})
    yield _case("Event", "unknown_kind", "missing", {k: v for k, v in base.items() if k != "kind"})
    yield _case("Event", "unknown_kind", "a number", {**base, "kind": 5})
    yield _case("Event", "unknown_kind", "another kind's payload", {**base, "kind": "tool_outcome"})
    too_big = {**base, "payload": {"text": "x" * MAX_EVENT_BYTES}}
    yield _case("Event", "oversize", f"over {MAX_EVENT_BYTES} bytes", too_big)
    for ts in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-00:30"):
        yield _case("Event", "client_ts_range", ts, {**base, "client_ts": ts})


_TIMESTAMPS = {
    "2026-01-31T09:30:00Z": True,
    "2026-01-31t09:30:00.123456789z": True,
    "2026-01-31T09:30:00-23:59": True,
    "2024-02-29T00:00:00+00:00": True,
    "2026-01-31T09:30:00": False,  # no offset
    "2026-01-31T09:30Z": False,  # no seconds
    "2026-01-31 09:30:00Z": False,
    "2026-01-31": False,
    "1769851800": False,
    "2026-02-29T00:00:00Z": False,
    "2026-01-31T24:00:00Z": False,
    "2016-12-31T23:59:60Z": False,  # a leap second: RFC 3339 has them, Python does not
    "2026-01-31T09:30:00+0100": False,
    "0000-01-01T00:00:00Z": False,
    "２０２６-01-31T09:30:00Z": False,
}


def _timestamps() -> Iterator[Case]:
    for ts in _TIMESTAMPS:
        yield _case("Event", "timestamp", ts, {**EVENTS[0], "client_ts": ts})
        yield _case(
            "SearchRequest", "timestamp", ts, {**REQUESTS["SearchRequest"][0], "since": ts, "until": None}
        )


_PREPARE = {"session_id": "s1", "run_id": "r1", "instance_id": "main"}
_HOOK = REQUESTS["HookSet"][0]["hooks"][0]
# Rules between values: the models check them, JSON Schema cannot say them.
CROSS_FIELD = {
    "end_line before start_line": (
        "PrepareRequest",
        {
            **_PREPARE,
            "budget_tokens": 900,
            "evidence": [{"thread_id": "r1.main", "seq": 2, "start_line": 5, "end_line": 4}],
        },
    ),
    "no room for input": (
        "PrepareRequest",
        {**_PREPARE, "profile": {"name": "m", "context_window": 1000, "output_reserve": 1000}},
    ),
    "until before since": (
        "SearchRequest",
        {"session_id": "s1", "query": "x", "since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
    ),
    "target above trigger": (
        "ContextPolicy",
        {"name": "p", "compaction": {"triggers": {"context_ratio": 0.5}, "target_context_ratio": 0.6}},
    ),
    "water levels out of order": (
        "ContextPolicy",
        {"name": "p", "window": {"levels": {"yellow": 0.8, "orange": 0.7}}},
    ),
    "a hook name twice": ("HookSet", {"release": "r", "hooks": [_HOOK, _HOOK]}),
    "a purpose twice": ("HookSet", {"release": "r", "hooks": [{**_HOOK, "purposes": ["action", "action"]}]}),
    "grants at another point": (
        "HookSet",
        {"release": "r", "hooks": [{**_HOOK, "point": "context.prepare.after"}]},
    ),
}


def _cross_field() -> Iterator[Case]:
    for what, (message, body) in CROSS_FIELD.items():
        yield _case(message, "cross_field", what, body)


def corpus() -> list[Case]:
    cases = [*_kinds(), *_timestamps(), *_cross_field()]
    for message, bodies in VALID.items():
        for body in bodies:
            cases.extend(_mutations(message, body))
        cases.extend(_whole(message, bodies[0]))
    return cases


CORPUS = corpus()


# --- The comparison -----------------------------------------------------------------------------------


def test_the_corpus_covers_every_message_the_fleet_receives_with_a_decoder_and_valid_bodies() -> None:
    assert set(FLEET) == set(RECEIVED) == set(VALID)
    invalid = [
        (c.message, c.what) for c in CORPUS if c.cls == "valid" and not fleet_accepts(c.message, c.raw)
    ]
    assert invalid == []
    assert {c.cls for c in CORPUS} >= {
        "wrong_type",
        "string_for_int",
        "missing_field",
        "unknown_field",
        "unknown_kind",
        *DECODER_ONLY,
    }


@pytest.mark.parametrize("message", sorted(VALID))
def test_the_schema_and_the_fleet_accept_exactly_the_same_messages(message: str) -> None:
    differ = [
        f"{c.cls}: {c.what}: schema {'accepts' if s else 'refuses'}, fleet {'accepts' if f else 'refuses'}"
        for c in CORPUS
        if c.message == message and c.cls not in DECODER_ONLY
        for s, f in [(schema_accepts(c.message, c.raw), fleet_accepts(c.message, c.raw))]
        if s != f
    ]
    assert differ == []


@pytest.mark.parametrize("cls", sorted(DECODER_ONLY))
def test_the_fleet_refuses_more_than_the_schema_only_where_json_schema_cannot_say_the_rule(cls: str) -> None:
    cases = [c for c in CORPUS if c.cls == cls]
    judged = [(c, schema_accepts(c.message, c.raw), fleet_accepts(c.message, c.raw)) for c in cases]
    # Never the other way round: what the fleet takes, the schema takes.
    assert [f"{c.message}: {c.what}" for c, s, f in judged if f and not s] == []
    # And the class is listed because it is a real difference, not a stale entry.
    assert any(s and not f for _, s, f in judged), f"{cls}: no case the schema accepts and the fleet refuses"


def test_docs_list_every_decoder_only_class() -> None:
    wire = (ROOT / "docs" / "wire.md").read_text()
    section = wire.split("### What only the fleet checks", 1)[1].split("\n## ", 1)[0]
    assert [cls for cls in DECODER_ONLY if f"`{cls}`" not in section] == []


def test_a_typed_integer_is_taken_by_both_up_to_64_bits_and_refused_by_both_beyond() -> None:
    def judged(value: int) -> tuple[bool, bool]:
        raw = json.dumps({**_PREPARE, "budget_tokens": value}).encode()
        return schema_accepts("PrepareRequest", raw), fleet_accepts("PrepareRequest", raw)

    assert judged(JSON_INT_MAX) == (True, True)
    assert judged(JSON_INT_MAX + 1) == (False, False)


def test_a_string_for_an_integer_is_refused_by_both_as_the_schema_types_it() -> None:
    raw = json.dumps({**_PREPARE, "budget_tokens": "8000"}).encode()
    assert (schema_accepts("PrepareRequest", raw), fleet_accepts("PrepareRequest", raw)) == (False, False)
    with pytest.raises(InvalidRequest, match="budget_tokens"):
        parse_body(PrepareRequest, raw)
