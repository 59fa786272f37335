"""The read-side record: what the assembler needs of one ledger record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pydantic import JsonValue

from .render import TokenCounts

__all__ = ["LedgerRecord"]


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """A record as the assembler reads it: model-visible text and the tokens counted at recording."""

    seq: int
    event_key: str
    kind: str
    payload: Mapping[str, JsonValue]
    text: str
    tokens: TokenCounts
    # A short preview of a long tool output and its tokens, shown when the hot path must shed tokens.
    mask_text: str | None = None
    mask_tokens: TokenCounts | None = None
    # Which thread wrote it, and its seq there; a view orders records by ``seq`` = session seq.
    thread_id: str = ""
    thread_seq: int = 0
