"""JSON Schema (draft 2020-12) of every message on the wire, shaped for strict validators.

Pydantic's output is close to what other languages need, but not quite:

1. It emits OpenAPI's ``discriminator`` on a tagged union (``Event``), with a ``mapping`` that ajv's
   ``discriminator`` option refuses. The schema files keep ``{"propertyName": "kind"}`` alone, so ajv
   (``discriminator: true``) reports one error for an unknown or missing kind instead of one per
   branch; the AsyncAPI document writes AsyncAPI's own form, the property's name. Each branch pins
   its tag with ``const`` and requires it, so validators that ignore the keyword agree.
2. Integers are typed within signed 64-bit (``contracts.wire_json``), the range the fleet reads.
3. A standalone file needs ``$schema`` (the dialect) and ``$id`` (a stable name to ``$ref`` it by).
4. The AsyncAPI document shares one ``components/schemas``: there the definitions are generated
   together, with references into it.
5. A ``$ref`` beside ``"default": null`` (a free-form ``JsonValue``) loses the default: generators
   would take null's type for the value's and type any JSON value as an object.
6. A field has no title: pydantic's (the field's name, capitalized) would name a type in generators,
   and take the name of the type the field holds.
7. What the fleet sends (replies, dead letters, notices) never carries ``null``
   (``contracts.reply_json``): there a field that can be ``None`` is typed without ``null`` and is
   simply optional. What it receives may carry ``null`` (the Python client sends it), so requests
   and events keep it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter

from contracts._base import none_omitted
from contracts.wire_json import JSON_INT_MAX, JSON_INT_MIN

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
    # Sent by the fleet through ``contracts.reply_json``: no field is ever null.
    omits_none: bool = False

    @classmethod
    def of(cls, model: type[BaseModel], *, sent: bool = False) -> WireMessage:
        """The message of one pydantic model, named after it; ``sent``: the fleet sends it."""
        return cls(model.__name__, TypeAdapter(model), (model.__doc__ or "").strip(), sent)


def schema_id(name: str) -> str:
    return f"{_ID_PREFIX}{name}"


def strict_schema(schema: Any, *, asyncapi: bool = False) -> Any:
    """``schema`` as validators in other languages take it (module docstring), walked by keyword so no
    property is touched; ``asyncapi``: the discriminator in the AsyncAPI document's form."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "discriminator":
            out[key] = value["propertyName"] if asyncapi else {"propertyName": value["propertyName"]}
            # ajv's strict mode wants the type its keyword applies to said beside it.
            out["type"] = "object"
        elif key in _ONE:
            out[key] = strict_schema(value, asyncapi=asyncapi)
        elif key in _MANY:
            out[key] = [strict_schema(v, asyncapi=asyncapi) for v in value]
        elif key == "properties":
            out[key] = {name: _untitled(strict_schema(v, asyncapi=asyncapi)) for name, v in value.items()}
        elif key in _MAPS:
            out[key] = {name: strict_schema(v, asyncapi=asyncapi) for name, v in value.items()}
        else:
            out[key] = value
    if "$ref" in out and "default" in out and out["default"] is None:
        # A free-form value (``JsonValue``) whose default is null: generators read the default's
        # type, and json-schema-to-typescript would type any JSON value as an object.
        del out["default"]
    if out.get("type") == "integer":
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = JSON_INT_MIN
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = JSON_INT_MAX
    return out


def _untitled(schema: Any) -> Any:
    # Pydantic titles every field after its name ("Model Profile"); generators name a type after a
    # title, so the field's title would take the name of the type it holds (ModelProfile1).
    if isinstance(schema, dict):
        schema.pop("title", None)
    return schema


def message_schema(message: WireMessage) -> dict[str, Any]:
    """A standalone schema file of one message: dialect, id, and its definitions under ``$defs``."""
    schema = strict_schema(message.adapter.json_schema())
    if message.omits_none:
        none_omitted(schema)
        for definition in schema.get("$defs", {}).values():
            none_omitted(definition)
    schema.setdefault("title", message.name)
    if message.description:
        schema.setdefault("description", message.description)
    return {"$schema": DIALECT, "$id": schema_id(message.name), **schema}


def component_schemas(messages: Iterable[WireMessage], ref_template: str) -> dict[str, Any]:
    """Every message's schema and every definition they use, in one map referenced by ``ref_template``
    (the AsyncAPI document's ``components/schemas``)."""
    listed = list(messages)
    by_key, top = TypeAdapter.json_schemas(
        [(m.name, "validation", m.adapter) for m in listed], ref_template=ref_template
    )
    components: dict[str, Any] = {
        name: strict_schema(s, asyncapi=True) for name, s in top.get("$defs", {}).items()
    }
    for m in listed:
        schema = strict_schema(by_key[(m.name, "validation")], asyncapi=True)
        # A model's own entry is a bare $ref to its definition; a union (Event) is inline.
        if set(schema) != {"$ref"}:
            schema.setdefault("title", m.name)
            if m.description:
                schema.setdefault("description", m.description)
            components[m.name] = schema
    _omit_none_where_sent(listed, components, ref_template)
    return _sorted(components)


def _omit_none_where_sent(messages: list[WireMessage], components: dict[str, Any], ref_template: str) -> None:
    """Drop ``null`` from every definition only the fleet sends; one both sides use would be refused."""
    prefix = ref_template.split("{model}")[0]
    sent: set[str] = set()
    received: set[str] = set()
    for m in messages:
        reach = _reachable(m.name, components, prefix)
        (sent if m.omits_none else received).update(reach)
    for name in sorted(sent):
        if name in received and _nullable(components[name]):
            raise ValueError(f"{name} is both sent (no nulls) and received (nulls allowed)")
        none_omitted(components[name])


def _reachable(name: str, components: Mapping[str, Any], prefix: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen or current not in components:
            continue
        seen.add(current)
        todo.extend(ref[len(prefix) :] for ref in _refs(components[current]) if ref.startswith(prefix))
    return seen


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def _nullable(schema: Mapping[str, Any]) -> bool:
    return any({"type": "null"} in p.get("anyOf", ()) for p in schema.get("properties", {}).values())


def _sorted(components: Mapping[str, Any]) -> dict[str, Any]:
    return {name: components[name] for name in sorted(components)}
