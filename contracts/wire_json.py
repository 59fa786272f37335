"""The JSON text of every message the fleet receives: its fixed limits, and the strict decode behind them.

The limits hold for events and requests alike, so that nothing accepted can fail later in Python, in
the planner or in PostgreSQL (where a failure would stall a whole partition, or reach a client as a
driver's error). They are part of the wire contract: never loosen one without checking every reader
of stored payloads. JSON Schema cannot state them (its validators see parsed values), so the schemas
accept what breaks them and the fleet refuses it (docs/wire.md, "What only the fleet checks"):

* every key unique within its object: readers disagree on which of two equal keys wins;
* every number finite and every integer within signed 64-bit;
* objects and arrays nested at most :data:`MAX_JSON_DEPTH` levels;
* strings (keys included) valid Unicode without U+0000.

Past the limits, :func:`validate_wire` validates in pydantic's strict mode, the mode whose types are
the schemas' types: a string is never an integer, a number never a string or a boolean.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

__all__ = [
    "JSON_INT_MAX",
    "JSON_INT_MIN",
    "JsonProblem",
    "MAX_JSON_DEPTH",
    "WireJsonError",
    "validate_wire",
    "wire_loads",
]

_M = TypeVar("_M", bound=BaseModel)

# 64 levels: real tool-call arguments nest a handful deep; 64 is far above any of them and far below
# Python's recursion limit (1000), which json.loads, pydantic, canonical_json and PostgreSQL's jsonb
# parser must all stay under with their own frames on the stack.
MAX_JSON_DEPTH = 64
# Signed 64-bit: what PostgreSQL bigint, Go int64, Java long and every runtime's JSON reader hold.
# Beyond it Python refuses to parse past 4,300 digits, and other readers silently lose precision.
JSON_INT_MIN = -(2**63)
JSON_INT_MAX = 2**63 - 1
# An int literal longer than this (sign included) is out of range without converting it: JSON has no
# leading zeros, and len("-9223372036854775808") == 20.
_INT_MAX_CHARS = 20
# Only an escape can put U+0000 or a surrogate into a decoded JSON string: raw control characters
# are refused by json.loads and raw surrogates cannot be valid UTF-8. This cheap search over the
# text lets the common message skip the walk over every string.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")
# A key named in a message is cut to this many characters.
_KEY_CHARS = 100

JsonProblem = Literal["encoding", "syntax", "limit"]


class WireJsonError(ValueError):
    """Bytes that are not JSON within the wire's limits.

    ``problem``: ``encoding`` (not UTF-8, a lone surrogate, U+0000), ``syntax`` (not JSON) or
    ``limit`` (a key repeated, a number out of range, too deep); ``details["limit"]`` names the limit.
    """

    def __init__(self, problem: JsonProblem, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.problem: JsonProblem = problem
        self.message = message
        self.details = details


class _Refused(Exception):
    """Raised inside json.loads hooks; carries the error to raise instead."""

    def __init__(self, error: WireJsonError) -> None:
        super().__init__(error.message)
        self.error = error


def _parse_int(literal: str) -> int:
    if len(literal) <= _INT_MAX_CHARS:
        value = int(literal)
        if JSON_INT_MIN <= value <= JSON_INT_MAX:
            return value
    raise _Refused(
        WireJsonError(
            "limit",
            f"integer of {len(literal.lstrip('-'))} digits is outside signed 64-bit "
            f"(JSON_INT_MIN..JSON_INT_MAX = {JSON_INT_MIN}..{JSON_INT_MAX}); send it as a string",
            {
                "limit": "JSON_INT_MIN" if literal.startswith("-") else "JSON_INT_MAX",
                "digits": len(literal.lstrip("-")),
            },
        )
    )


def _parse_float(literal: str) -> float:
    value = float(literal)
    if math.isfinite(value):
        return value
    raise _non_finite(literal[:40])


def _parse_constant(name: str) -> float:
    # json.loads accepts NaN, Infinity and -Infinity, which are not JSON and not storable in jsonb.
    raise _non_finite(name)


def _non_finite(literal: str) -> _Refused:
    return _Refused(
        WireJsonError(
            "limit",
            f"number {literal} is not finite; JSON numbers must be finite (jsonb stores no NaN or Infinity)",
            {"limit": "finite_numbers", "number": literal},
        )
    )


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # One call per object: a repeated key leaves the dict shorter than its pairs, so the check costs
    # a comparison, and finding which key it was only happens on the way out.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Refused(_repeated(pairs))
    return obj


def _repeated(pairs: list[tuple[str, Any]]) -> WireJsonError:
    seen: set[str] = set()
    key = ""
    for key, _ in pairs:
        if key in seen:
            break
        seen.add(key)
    # ascii(): the key may hold what no reason may (U+0000, a lone surrogate); it is written escaped.
    shown = ascii(key[:_KEY_CHARS])[1:-1]
    return WireJsonError(
        "limit",
        f"key '{shown}' appears twice in one object; JSON keys must be unique "
        "(readers disagree on which value wins)",
        {"limit": "unique_keys", "key": shown},
    )


def _too_deep() -> WireJsonError:
    return WireJsonError(
        "limit",
        f"objects and arrays nest deeper than MAX_JSON_DEPTH = {MAX_JSON_DEPTH} levels of objects and arrays",
        {"limit": "MAX_JSON_DEPTH", "max_depth": MAX_JSON_DEPTH},
    )


def _check_string(value: str) -> None:
    if "\x00" in value:
        raise WireJsonError(
            "encoding",
            "a string contains U+0000 (NUL), which PostgreSQL text cannot store; "
            "the fleet refuses it rather than alter the text",
            {"limit": "no_nul", "offset": value.index("\x00")},
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise WireJsonError(
            "encoding",
            f"a string contains a lone surrogate (U+{ord(value[exc.start]):04X}); "
            "JSON strings must be valid Unicode (surrogate escapes only in pairs)",
            {"limit": "no_lone_surrogates", "offset": exc.start},
        ) from None


def _check_depth(root: object) -> None:
    """At most MAX_JSON_DEPTH levels of containers; level by level, never recursive."""
    level = [root]
    depth = 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise _too_deep()
        deeper: list[object] = []
        for node in level:
            children: Any = node.values() if type(node) is dict else node if type(node) is list else ()
            # json.loads builds exact dicts and lists; `type() is` is the cheap test on this path.
            deeper.extend(c for c in children if type(c) is dict or type(c) is list)
        level = deeper


def _check_strings(root: object) -> None:
    """Every key and string value is storable text; iterative, since depth is not checked yet."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            _check_string(node)
        elif isinstance(node, dict):
            for key in node:
                _check_string(key)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


# Built once: json.loads with hooks would build a decoder (and its C scanner) on every call.
_DECODER = json.JSONDecoder(
    parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant, object_pairs_hook=_object
)


def wire_loads(raw: bytes) -> object:
    """The JSON value of ``raw``, within the wire's limits (module docstring).

    Raises:
        WireJsonError: naming the problem and, for a limit, ``details["limit"]``: ``unique_keys``,
            ``finite_numbers``, ``JSON_INT_MIN``/``JSON_INT_MAX``, ``MAX_JSON_DEPTH``, ``no_nul``,
            ``no_lone_surrogates``.
    """
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise WireJsonError(
            "encoding", f"not valid UTF-8 (byte {exc.start})", {"offset": exc.start}
        ) from None
    try:
        obj = _DECODER.decode(text)
    except _Refused as exc:
        raise exc.error from None
    except json.JSONDecodeError as exc:
        raise WireJsonError("syntax", f"not JSON: {exc.msg} at {exc.pos}", {"offset": exc.pos}) from None
    except RecursionError:
        # json.loads hit Python's recursion limit: far deeper than MAX_JSON_DEPTH.
        raise _too_deep() from None
    # Nesting needs one bracket per level, so a text with few brackets cannot be too deep, and one
    # without a suspect escape holds no NUL or surrogate: most messages skip both walks.
    if text.count("{") + text.count("[") > MAX_JSON_DEPTH:
        _check_depth(obj)
    if _SUSPECT_ESCAPE.search(text) is not None:
        _check_strings(obj)
    return obj


def validate_wire(model: type[_M], raw: bytes) -> _M:
    """``raw`` as a ``model``: within the wire's limits, then validated strictly.

    Raises:
        WireJsonError: outside the limits (:func:`wire_loads`).
        pydantic.ValidationError: not a valid ``model``.
    """
    wire_loads(raw)
    return model.model_validate_json(raw, strict=True)
