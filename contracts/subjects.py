"""Subject, stream and consumer names: defined once, used everywhere.

Runtimes publish to ``ctx.events.<session>.<run>.<instance>``. The ``CTX_EVENTS`` stream rewrites
that, on the server, to ``ctx.p.<partition>.<session>.<run>.<instance>`` where the partition is
FNV-1a of the session token modulo the partition count. A whole session — its runs, main threads and
children — lands in one partition and is recorded in publish order by one writer: decisions that span
threads (a new question only after the previous run ended, a child only after its parent exists)
see events in the order the runtime published them. Sessions spread across partitions.
"""

from __future__ import annotations

import hashlib

from .ids import is_identifier, split_thread_id

__all__ = [
    "DEAD",
    "DEAD_STREAM",
    "EVENTS",
    "EVENTS_STREAM",
    "INSPECT",
    "PARTITIONED",
    "PREPARE",
    "RECORDED",
    "dead_subject",
    "events_subject",
    "inspect_subject",
    "msg_id_of",
    "partition_consumer",
    "partition_filter",
    "partition_of",
    "partition_transform",
    "prepare_subject",
    "recorded_subject",
    "session_from_partitioned_subject",
    "thread_from_partitioned_subject",
]

EVENTS = "ctx.events"
PARTITIONED = "ctx.p"
RECORDED = "ctx.recorded"
PREPARE = "ctx.prepare"
INSPECT = "ctx.inspect"
DEAD = "ctx.dead"

EVENTS_STREAM = "CTX_EVENTS"
DEAD_STREAM = "CTX_DEAD"


def msg_id_of(thread_id: str, event_key: str, data: bytes) -> str:
    """The ``Nats-Msg-Id`` of an event: thread, key and a digest of the exact bytes.

    JetStream then drops only byte-identical retries. Anything else under a known key (a conflicting
    reuse, another session claiming the thread) reaches the recorder, which rejects it with a
    reason instead of the publisher being told "duplicate" and nothing else. The recorder checks
    the header against the body, so a publisher that derives it otherwise learns so from a dead
    letter on its first event, not from a silent duplicate later.
    """
    return f"{thread_id}/{event_key}/{hashlib.sha256(data).hexdigest()[:16]}"


def events_subject(session_id: str, thread_id: str) -> str:
    """Where a runtime publishes the events of ``thread_id`` in ``session_id``."""
    split_thread_id(thread_id)
    if not is_identifier(session_id) and session_id != "_":
        raise ValueError(f"not a valid session id: {session_id!r}")
    return f"{EVENTS}.{session_id}.{thread_id}"


def prepare_subject(thread_id: str) -> str:
    """Where a runtime asks for the prepared context of ``thread_id`` (request/reply)."""
    split_thread_id(thread_id)
    return f"{PREPARE}.{thread_id}"


def inspect_subject(thread_id: str) -> str:
    """Where an operator asks for the ledger view of ``thread_id`` (request/reply)."""
    split_thread_id(thread_id)
    return f"{INSPECT}.{thread_id}"


def recorded_subject(thread_id: str) -> str:
    """Where the recorder announces that a thread's ledger moved (core NATS, a hint only)."""
    return f"{RECORDED}.{thread_id}"


def dead_subject(thread_id: str | None) -> str:
    """Where a rejected event goes; ``_`` stands for a message whose thread could not be read."""
    return f"{DEAD}.events.{thread_id or '_._'}"


def partition_of(session_id: str, *, partitions: int) -> int:
    """The partition the server assigns to a session: FNV-1a 32 over the session token, mod n.

    This mirrors nats-server's ``{{partition(n,1)}}`` so clients and tests can predict routing.
    """
    h = 0x811C9DC5
    for b in session_id.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def partition_transform(partitions: int) -> tuple[str, str]:
    """The ``(source, destination)`` subject transform of the events stream."""
    return (
        f"{EVENTS}.*.*.*",
        f"{PARTITIONED}.{{{{partition({partitions},1)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}.{{{{wildcard(3)}}}}",
    )


def partition_filter(partition: int) -> str:
    """The filter subject of one partition's consumers."""
    return f"{PARTITIONED}.{partition}.*.*.*"


def partition_consumer(worker: str, partition: int) -> str:
    """The durable consumer name of ``worker`` on ``partition`` (e.g. ``recorder-p3``)."""
    return f"{worker}-p{partition}"


def thread_from_partitioned_subject(subject: str) -> str | None:
    """The thread id carried by a stored subject ``ctx.p.<n>.<session>.<run>.<instance>``."""
    parts = subject.split(".")
    if len(parts) != 6 or f"{parts[0]}.{parts[1]}" != PARTITIONED:
        return None
    return f"{parts[4]}.{parts[5]}"


def session_from_partitioned_subject(subject: str) -> str | None:
    """The session token of a stored subject ``ctx.p.<n>.<session>.<run>.<instance>``."""
    parts = subject.split(".")
    if len(parts) != 6 or f"{parts[0]}.{parts[1]}" != PARTITIONED:
        return None
    return parts[3]
