"""JSON Schema (draft 2020-12) of every message on the wire, shaped for strict validators.

Pydantic's output is close to what other languages need, but not quite:

1. It emits ``discriminator`` (an OpenAPI keyword) on tagged unions; strict JSON Schema validators
   (ajv) refuse unknown keywords. Each branch already pins its tag with ``const``, so the keyword
   adds nothing a validator needs and is removed.
2. A standalone file needs ``$schema`` (the dialect) and ``$id`` (a stable name to ``$ref`` it by).
3. The AsyncAPI document shares one ``components/schemas``: there the definitions are generated
   together, with references into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter

__all__ = ["DIALECT", "WireMessage", "component_schemas", "message_schema", "schema_id", "strict_schema"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Names, not locations: nothing is served there, and the wire version (schema_version 1) is in it
# so a future version 2 of a message gets a new id beside the old one.
_ID_PREFIX = "urn:ctxfleet:wire:1:"

# Keywords whose value is one subschema, a list of them, or a name → subschema map (draft 2020-12).
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas")


@dataclass(frozen=True, slots=True)
class WireMessage:
    """A message on the wire: its name (the schema's file and component name) and its type."""

    name: str
    adapter: TypeAdapter[Any]
    description: str

    @classmethod
    def of(cls, model: type[BaseModel]) -> WireMessage:
        """The message of one pydantic model, named after it."""
        return cls(model.__name__, TypeAdapter(model), (model.__doc__ or "").strip())


def schema_id(name: str) -> str:
    """The ``$id`` of a message's schema."""
    return f"{_ID_PREFIX}{name}"


def strict_schema(schema: Any) -> Any:
    """``schema`` without OpenAPI's ``discriminator``, walked by keyword so no property is touched."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "discriminator":
            continue
        if key in _ONE:
            out[key] = strict_schema(value)
        elif key in _MANY:
            out[key] = [strict_schema(v) for v in value]
        elif key in _MAPS:
            out[key] = {name: strict_schema(v) for name, v in value.items()}
        else:
            out[key] = value
    return out


def message_schema(message: WireMessage) -> dict[str, Any]:
    """A standalone schema file of one message: dialect, id, and its definitions under ``$defs``."""
    schema = strict_schema(message.adapter.json_schema())
    schema.setdefault("title", message.name)
    if message.description:
        schema.setdefault("description", message.description)
    return {"$schema": DIALECT, "$id": schema_id(message.name), **schema}


def component_schemas(messages: Iterable[WireMessage], ref_template: str) -> dict[str, Any]:
    """Every message's schema and every definition they use, in one map referenced by ``ref_template``."""
    listed = list(messages)
    by_key, top = TypeAdapter.json_schemas(
        [(m.name, "validation", m.adapter) for m in listed], ref_template=ref_template
    )
    components: dict[str, Any] = {name: strict_schema(s) for name, s in top.get("$defs", {}).items()}
    for m in listed:
        schema = strict_schema(by_key[(m.name, "validation")])
        # A model's own entry is a bare $ref to its definition; a union (Event) is inline.
        if set(schema) != {"$ref"}:
            schema.setdefault("title", m.name)
            if m.description:
                schema.setdefault("description", m.description)
            components[m.name] = schema
    return _sorted(components)


def _sorted(components: Mapping[str, Any]) -> dict[str, Any]:
    return {name: components[name] for name in sorted(components)}
