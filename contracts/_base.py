"""The base every wire model shares: frozen, closed, versioned; and the schema rules validators hold."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
)

__all__ = [
    "SchemaVersion",
    "TIMESTAMP_PATTERN",
    "Timestamp",
    "TimestampOutOfRange",
    "WireModel",
    "forbidden_shapes",
    "is_none",
    "none_omitted",
    "reply_json",
]

_SchemaRule = Callable[[dict[str, Any]], None]


def _not_a_boolean(value: object) -> object:
    # pydantic's Literal[1] takes true, even strictly (True == 1 in Python); JSON's true is no number.
    if isinstance(value, bool):
        raise ValueError("Input should be 1")
    return value


# The wire's version in every message: the number 1.
SchemaVersion = Annotated[Literal[1], BeforeValidator(_not_a_boolean)]


class WireModel(BaseModel):
    """A frozen model that rejects unknown fields, so a typo is an error and not a silent default."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def reply_json(reply: BaseModel) -> bytes:
    """A reply or dead letter as it travels: no field is ``null``, an absent one is ``None``.

    Every field of a reply that can be ``None`` defaults to ``None``, so parsing the bytes gives the
    same model back. Only for what the fleet sends: in a request, ``null`` may mean "off" where the
    default is not ``None`` (a policy's ``context_ratio``), and free-form JSON (``details``, a
    provider body) keeps its nulls, since pydantic leaves values inside a dict alone.
    """
    return reply.model_dump_json(exclude_none=True).encode()


def forbidden_shapes(*shapes: dict[str, Any]) -> _SchemaRule:
    """A ``json_schema_extra`` that states a model validator's rule in the schema, for other languages.

    Each shape is an object schema (``properties``, ``required``) of a body the model refuses. A
    property typed in a shape but absent from the body still matches (that is what ``properties``
    means), so "absent or null" is ``{"type": "null"}`` and "present, not null" needs ``required``.

    The rule is written ``if <shape> then false else …``: validators apply it, and code generators
    (json-schema-to-typescript, datamodel-code-generator, Modelina) leave it out of the type, where a
    top-level ``anyOf`` would turn one request into a union of anonymous one-property types.
    """

    def add(schema: dict[str, Any]) -> None:
        rule: dict[str, Any] = {}
        for shape in reversed(shapes):
            rule = {"if": {"type": "object", **shape}, "then": False, **({"else": rule} if rule else {})}
        schema.update(rule)

    return add


def is_none(value: object) -> bool:
    """An ``exclude_if`` rule: a field left out of every dump while it is ``None``.

    A field rule, not a wrap serializer: a wrap serializer builds the whole model as Python objects
    before JSON, which doubles the cost of a prepared context's reply.
    """
    return value is None


def none_omitted(schema: dict[str, Any]) -> None:
    """A ``json_schema_extra`` for a model whose serializer omits ``None`` fields: none is ever null."""
    for prop in schema.get("properties", {}).values():
        options = prop.get("anyOf")
        if options is None or {"type": "null"} not in options:
            continue
        rest = [o for o in options if o != {"type": "null"}]
        del prop["anyOf"]
        prop.pop("default", None)
        if len(rest) == 1:
            prop.update(rest[0])
        else:
            prop["anyOf"] = rest


# RFC 3339's date-time, which JSON Schema's "date-time" format names: seconds and an offset required,
# no leap second (Python has none), no year 0. [0-9], not \d: the digits of other scripts are not
# digits here. The schema carries it beside the format, so validators without format checks agree.
TIMESTAMP_PATTERN = (
    r"^(?!0000)[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]"
    r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
_TIMESTAMP = re.compile(TIMESTAMP_PATTERN)
_DATETIME: TypeAdapter[datetime] = TypeAdapter(datetime)


class TimestampOutOfRange(ValueError):
    """A time that cannot be written in UTC within years 1..9999, so cannot be stored."""


def _timestamp(value: object, info: ValidationInfo) -> datetime:
    # From JSON only an RFC 3339 string: pydantic alone also takes "1700000000", "2026-01-31T09:30"
    # and times without an offset, which the schema refuses. From Python, what pydantic takes. All
    # in one validator that hands pydantic a datetime (a second one cost another microsecond).
    if isinstance(value, datetime):
        parsed = value
    elif info.mode == "json":
        if not isinstance(value, str) or _TIMESTAMP.match(value) is None:
            raise ValueError(
                "not an RFC 3339 date-time with seconds and an offset, such as 2026-01-31T09:30:00Z"
            )
        try:
            parsed = datetime.fromisoformat(value.upper())
        except ValueError:
            raise ValueError("no such date (a day past its month's end)") from None
    else:
        try:
            parsed = _DATETIME.validate_python(value)
        except ValidationError as exc:
            raise ValueError(exc.errors(include_url=False)[0]["msg"]) from None
    # Naive (only from Python) is UTC, as the store reads it; what cannot be written in UTC within
    # years 1..9999 (0001-01-01T00:00:00+01:00) cannot be stored.
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=timezone.utc)
    try:
        parsed.astimezone(timezone.utc)
    except OverflowError:
        raise TimestampOutOfRange("outside years 1..9999 once converted to UTC") from None
    return parsed


# A point in time a runtime sends: RFC 3339 on the wire (TIMESTAMP_PATTERN), never naive in Python.
Timestamp = Annotated[
    datetime,
    BeforeValidator(_timestamp),
    WithJsonSchema({"type": "string", "format": "date-time", "pattern": TIMESTAMP_PATTERN}),
]
