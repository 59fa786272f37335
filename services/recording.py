"""The recorder's service: one fetched batch in, one Postgres transaction out.

Optimistic: read what the batch touches, plan every write with no lock held (tokenizing is the
expensive part), then write in one transaction that compare-and-sets each thread head. A moved head
or a key recorded meanwhile means another writer got there first: re-read and re-plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import asyncpg

from contracts import AssistantMessageEvent, DeadLetter, OperationReconcileEvent, ToolOutcomeEvent

from .errors import DuplicateEvent, RevisionConflict
from .hashing import sha256_hex
from .killpoints import kill_point
from .ledger import (
    BatchPlan,
    Decoded,
    Incoming,
    RecordingLimits,
    Rejection,
    decode_batch,
    encode_raw,
    plan_batch,
)
from .store._errors import translate_pg_errors
from .store.ledger import TrackingRepo, read_for_batch, write_plan
from .tokens import ENCODINGS, EncodingName, TokenCounter, counter_for

__all__ = ["BatchResult", "DeadLetterSink", "RecordingService", "dead_letter_of"]

_MAX_ATTEMPTS = 4


class DeadLetterSink(Protocol):
    """Where rejected events go (the dead-letter subject); must be idempotent per ``msg_id``."""

    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        """Publish one dead letter."""


@dataclass(frozen=True)
class BatchResult:
    """What a batch did, for acks, notices and metrics."""

    heads: Mapping[str, tuple[int, int]]
    recorded: int
    rejections: tuple[Rejection, ...]
    duplicates: int
    skipped: int
    attempts: int


def dead_letter_of(rejection: Rejection, keep_bytes: int) -> DeadLetter:
    """The wire form of a rejection."""
    raw = rejection.incoming.data
    b64, truncated = encode_raw(raw, keep_bytes)
    return DeadLetter(
        code=rejection.code,
        reason=rejection.reason,
        details=rejection.details,
        subject=rejection.incoming.subject,
        thread_id=rejection.thread_id,
        event_key=rejection.event_key,
        stream_seq=rejection.incoming.stream_seq,
        raw_size=len(raw),
        raw_sha256=sha256_hex(raw),
        raw_base64=b64,
        raw_truncated=truncated,
    )


class RecordingService:
    """Records batches of one partition of the events stream."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        sink: DeadLetterSink,
        *,
        limits: RecordingLimits,
        recorder_id: str,
        consumer: str = "recorder",
    ) -> None:
        self._pool = pool
        self._sink = sink
        self._limits = limits
        self._recorder_id = recorder_id
        self._consumer = consumer
        self._counters: dict[EncodingName, TokenCounter] = {name: counter_for(name) for name in ENCODINGS}

    async def record_batch(self, partition: int, batch: Sequence[Incoming]) -> BatchResult:
        """Apply a batch exactly once; raises a retryable error if the store is unavailable."""
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                return await self._attempt(partition, batch, attempt)
            except (RevisionConflict, DuplicateEvent):
                if attempt == _MAX_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    async def _attempt(self, partition: int, batch: Sequence[Incoming], attempt: int) -> BatchResult:
        async with self._pool.acquire() as conn:
            with translate_pg_errors():
                applied = await TrackingRepo.max_tracking_seq(conn, self._consumer, partition)
                fresh = [m for m in batch if m.stream_seq > applied]
                if not fresh:
                    return BatchResult({}, 0, (), 0, len(batch), attempt)
                decoded = decode_batch(fresh, self._limits)
                reads = await read_for_batch(conn, *_touched(decoded))
                plan = plan_batch(decoded, reads, self._limits, self._counters)
                for rejection in plan.rejections:
                    await self._sink.publish(
                        dead_letter_of(rejection, self._limits.dead_letter_keep_bytes), _dead_msg_id(rejection)
                    )
                async with conn.transaction():
                    await write_plan(
                        conn, plan, recorded_by=self._recorder_id, keep_raw=self._limits.dead_letter_keep_bytes
                    )
                    await TrackingRepo.insert_tracking(conn, self._consumer, partition, fresh[-1].stream_seq)
                    if plan.records:
                        kill_point("record.before_commit")
                if plan.records:
                    kill_point("record.after_commit")
        return _result(plan, skipped=len(batch) - len(fresh), attempt=attempt)


def _touched(
    decoded: Sequence[Decoded | Rejection],
) -> tuple[
    list[str], list[tuple[str, str]], list[tuple[str, str]], list[str], list[str], list[str], list[str], list[tuple[str, str]]
]:
    sessions: dict[str, None] = {}
    releases: dict[str, None] = {}
    operations: dict[tuple[str, str], None] = {}
    runs: dict[str, None] = {}
    parents: dict[str, None] = {}
    threads: dict[str, None] = {}
    keys: dict[tuple[str, str], None] = {}
    calls: dict[tuple[str, str], None] = {}
    for item in decoded:
        if isinstance(item, Rejection):
            continue
        thread = item.subject_thread
        threads[thread] = None
        sessions[item.event.session_id] = None
        runs[item.event.run_id] = None
        if item.event.agent_release:
            releases[item.event.agent_release] = None
        if isinstance(item.event, OperationReconcileEvent):
            operations[(item.event.session_id, item.event.payload.operation_id)] = None
        if item.event.parent_instance_id is not None:
            parents[f"{item.event.run_id}.{item.event.parent_instance_id}"] = None
        keys[(thread, item.event.event_key)] = None
        if isinstance(item.event, ToolOutcomeEvent):
            calls[(thread, item.event.payload.call_id)] = None
        elif isinstance(item.event, AssistantMessageEvent):
            for call in item.event.payload.tool_calls:
                calls[(thread, call.call_id)] = None
                if call.operation_id is not None:
                    operations[(item.event.session_id, call.operation_id)] = None
    return list(threads), list(keys), list(calls), list(sessions), list(runs), list(parents), list(releases), list(operations)


def _dead_msg_id(rejection: Rejection) -> str:
    return f"dead:{rejection.incoming.stream_seq}:{sha256_hex(rejection.incoming.data)[:16]}"


def _result(plan: BatchPlan, *, skipped: int, attempt: int) -> BatchResult:
    return BatchResult(
        heads={h.thread_id: (h.last_seq, h.revision) for h in plan.heads},
        recorded=len(plan.records),
        rejections=plan.rejections,
        duplicates=len(plan.duplicates),
        skipped=skipped,
        attempts=attempt,
    )
