"""Compaction jobs: what the budgeter (or a prepare over budget) asks a compactor to do."""

from __future__ import annotations

from ._base import SchemaVersion, WireModel

__all__ = ["COMPACTION_JOBS", "JOBS_STREAM", "CompactionJob", "compacted_subject"]

COMPACTION_JOBS = "ctx.compaction.jobs"
JOBS_STREAM = "CTX_JOBS"


def compacted_subject(thread_id: str) -> str:
    """Where a compactor announces a committed summary (wakes prepares waiting on it)."""
    return f"ctx.compacted.{thread_id}"


class CompactionJob(WireModel):
    """Compact one thread's view as it was at ``watermark``, under one policy revision."""

    schema_version: SchemaVersion = 1
    job_id: str
    thread_id: str
    session_id: str
    watermark: int
    view_revision: int
    policy_name: str
    policy_revision: int
    input_budget: int
    reasons: tuple[str, ...]
    urgent: bool = False
    # Tokens the prepare that asked must keep free besides the view (its tool schemas): the compactor
    # leaves room for them when it sizes the summary and the history it keeps.
    reserved_tokens: int = 0
