"""The base every wire model shares: frozen, closed, versioned; and the schema rules validators hold."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["WireModel", "any_of_schema", "is_none", "none_omitted", "reply_json"]

_SchemaRule = Callable[[dict[str, Any]], None]


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
    # The serializer's own bytes: ``model_dump_json`` decodes them, and encoding a large reply with any
    # non-ASCII character back cost ~1 µs per KB (issue 16).
    return reply.__pydantic_serializer__.to_json(reply, exclude_none=True)


def any_of_schema(*branches: dict[str, Any], forbid: dict[str, Any] | None = None) -> _SchemaRule:
    """A ``json_schema_extra`` that states a model validator's rule in the schema, for other languages.

    Each branch is an object schema (``properties``, ``required``); the model is valid when it matches
    one of them and does not match ``forbid``. A property typed in a branch but absent from the body
    still matches (that is what ``properties`` means), so "absent or a string" is ``{"type": "string"}``
    and "present, not null" needs ``required`` as well.
    """

    def add(schema: dict[str, Any]) -> None:
        schema["anyOf"] = [{"type": "object", **branch} for branch in branches]
        if forbid is not None:
            schema["not"] = {"type": "object", **forbid}

    return add


def is_none(value: object) -> bool:
    """An ``exclude_if`` rule: a field left out of every dump while it is ``None``.

    A field rule, not a wrap serializer: a wrap serializer builds the whole model as Python objects
    before JSON, which doubled the cost of a prepared context's reply (issue 16).
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
