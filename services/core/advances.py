"""A thread's head moved by one committed batch, as the process that recorded it can hand it over.

A read-your-writes prepare in the process whose recorder committed its event would otherwise read the
ledger once the commit was announced: one more round trip (0.9–1.3 ms after an agent's pause) for
records the recorder has just written from its own memory. A batch that writes nothing a view reads but the
thread's head and new records — a known thread's messages, calls and outcomes, its facts untouched —
extends the view held at the head it moved from into the view at the new head (design D14.21).

The records are rebuilt here exactly as a load reads them back (``services/store/ledger.py``,
``_RECORD_FIELDS``): the model-visible text is the view text, else the text; a text kept only in a blob
is not in the recorder's hands as the store returns it, so such a batch is not handed over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from services.core.ledger import HeadWrite, NewRecord, deferred_tokens
from services.core.records import LedgerRecord

__all__ = ["HeadAdvance", "read_back"]


@dataclass(frozen=True, slots=True)
class HeadAdvance:
    """One thread's head moved from ``head.expected_revision`` to ``head.revision`` by a committed batch
    that wrote nothing else a view reads; ``session_base`` is the session seq its first record follows
    (``session_ordinal`` counts from it), ``recorded_at`` the commit's clock."""

    head: HeadWrite
    records: tuple[NewRecord, ...]
    session_base: int
    recorded_at: datetime

    def ledger_records(self) -> list[LedgerRecord] | None:
        """The new records as a load would read them, in thread order; ``None`` if one is not in hand."""
        out: list[LedgerRecord] = []
        for record in self.records:
            read = read_back(record, self.session_base + record.session_ordinal, self.recorded_at)
            if read is None:
                return None
            out.append(read)
        return out


def read_back(record: NewRecord, session_seq: int, recorded_at: datetime) -> LedgerRecord | None:
    """``record`` as the store returns it once committed; ``None`` when its text is only in a blob."""
    text = record.view_text if record.view_text is not None else record.text
    if text is None and record.blob_sha256 is not None:
        return None
    text = text or ""
    mask_text, mask = record.mask_text, record.mask_tokens
    if mask_text is not None and mask is None:
        return None  # not written so by the planner; read back, its counts would be absent
    payload = json.loads(record.payload_json)
    return LedgerRecord(
        seq=session_seq,
        event_key=record.event_key,
        kind=record.kind,  # type: ignore[arg-type]  # a RecordKind's value, as a load passes it
        payload=payload,
        text=text,
        tokens=deferred_tokens(
            record.kind, payload, text, record.tokens.o200k_base, record.tokens.cl100k_counted
        ),
        mask_text=mask_text,
        mask_tokens=(
            deferred_tokens(record.kind, payload, mask_text, mask.o200k_base, mask.cl100k_counted)
            if mask_text is not None and mask is not None
            else None
        ),
        thread_id=record.thread_id,
        thread_seq=record.seq,
        recorded_at=recorded_at,
    )
