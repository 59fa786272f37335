"""``make schemas``: a JSON Schema (draft 2020-12) per wire message, and the AsyncAPI 3.0.0 document."""

from __future__ import annotations

import json
from pathlib import Path

from services.settings import Settings

from .asyncapi import CHANNELS, asyncapi_document, wire_messages
from .wire_schema import message_schema

__all__ = ["write_schemas"]


def write_schemas(out: Path, settings: Settings | None = None) -> list[Path]:
    """Write every schema under ``out`` (``<Message>.schema.json``, ``asyncapi.json``); returns the files.

    The AsyncAPI document's server is the NATS URL of ``settings`` (the environment's by default).
    """
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def dump(name: str, schema: object) -> None:
        path = out / name
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)

    for message in wire_messages(CHANNELS):
        dump(f"{message.name}.schema.json", message_schema(message))
    dump("asyncapi.json", asyncapi_document(settings or Settings()))
    return written
