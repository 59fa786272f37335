"""Compact JSON text of event content, written by orjson. Pure.

The recorder writes every event's payload as JSON text for the ledger, and the assembler every tool
call's arguments for the model; with the ``json`` module each cost ~15 µs for a sample event against
~1.2 µs with orjson (with ``json``, serialization is 13–24 % of the recorder's CPU in the ingest profile).

Invariants:

1. ``compact(v)`` is ``json.dumps(v, separators=(",", ":"), ensure_ascii=False)`` for every value
   without floats, byte for byte: keys in their order, no whitespace, non-ASCII as is
   (``tests/unit/test_json_text.py``).
2. A float may be written in another form of the same number (orjson ``1e16`` and ``0.00001`` where
   ``json`` writes ``1e+16`` and ``1e-05``), so nothing that must stay byte-stable across versions —
   a content hash — is computed from this text: those use ``hashing.canonical_json``.
3. What orjson refuses where ``json`` writes — integers beyond 64 bits, non-str keys, str, int, dict
   and list subclasses (enums), invalid UTF-8 — is written by ``json``, which writes or fails as it
   always did (datetimes and dataclasses are passed through to it, so they fail as before).
4. Callers pass finite numbers only (``json`` writes ``NaN``, orjson ``null``): decoded events
   reject non-finite numbers (``contracts/events.py``) and PostgreSQL's ``json`` type stores none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import orjson
from pydantic import JsonValue

__all__ = ["compact"]

_PASSTHROUGH = (
    orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
)


def compact(value: JsonValue | Mapping[str, JsonValue]) -> str:
    """Keys in their order, no whitespace, non-ASCII as is (invariant 1)."""
    try:
        return orjson.dumps(value, option=_PASSTHROUGH).decode("utf-8")
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
