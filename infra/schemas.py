"""``make schemas``: a JSON Schema per wire message, and the AsyncAPI document FastStream generates."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

from contracts import (
    DeadLetter,
    ErrorReply,
    InspectRequest,
    PreparedContext,
    PrepareRequest,
    ReadRequest,
    SearchReply,
    SearchRequest,
    ThreadInspection,
    event_json_schema,
)
from workers.compose import create_docs_app

__all__ = ["write_schemas"]

_MODELS: tuple[type[BaseModel], ...] = (
    PrepareRequest,
    PreparedContext,
    ErrorReply,
    DeadLetter,
    InspectRequest,
    ThreadInspection,
    SearchRequest,
    SearchReply,
    ReadRequest,
)


def write_schemas(out: Path) -> list[Path]:
    """Write every schema under ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def dump(name: str, schema: object) -> None:
        path = out / name
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)

    dump("Event.schema.json", event_json_schema())
    for model in _MODELS:
        dump(f"{model.__name__}.schema.json", model.model_json_schema())
    dump("asyncapi.json", create_docs_app().schema.to_specification().to_jsonable())
    return written
