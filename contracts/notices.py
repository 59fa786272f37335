"""Notices: the hints the fleet publishes on core NATS when a thread's ledger or view moved.

They only wake waiters — a prepare always re-checks the ledger — so a runtime may ignore them. The
models describe the bodies the recorder and compactor publish, for the schemas of other languages.
"""

from __future__ import annotations

from typing import Literal

from ._base import WireModel

__all__ = ["CompactedNotice", "RecordedNotice"]


class RecordedNotice(WireModel):
    """``ctx.recorded.<run>.<instance>``: the thread's head after a recorded batch.

    ``seq`` and ``revision`` are ``-1`` when the batch only dead-lettered events of the thread.
    """

    seq: int
    revision: int


class CompactedNotice(WireModel):
    """``ctx.compacted.<run>.<instance>``: a compaction job of the thread ended, however it ended."""

    status: Literal["committed", "deferred", "failed", "dropped", "stale"]
    view_revision: int
