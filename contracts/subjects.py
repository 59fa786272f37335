"""Subject, stream and consumer names: defined once, used everywhere.

Every subject a runtime may use carries its tenant as the token after the verb — ``ctx.events.<tenant>.…``,
``ctx.prepare.<tenant>.…``, ``ctx.read.<tenant>`` — so the NATS server's permissions, not a payload
field, confine an identity to its tenant, and the fleet takes the tenant from the subject the server
delivered (see ``infra/nats_accounts.py``).

Runtimes publish to ``ctx.events.<tenant>.<session>.<run>.<instance>``. The ``CTX_EVENTS`` stream rewrites
that, on the server, to ``ctx.p.<partition>.<tenant>.<session>.<run>.<instance>`` where the partition is
FNV-1a of the session token modulo the partition count. A whole session — its runs, main threads and children
— lands in one partition and is recorded in publish order by one writer: decisions that span threads (a new
question only after the previous run ended, a child only after its parent exists) see events in the order the
runtime published them. Sessions spread across partitions.

Every token a caller names — tenant, session, run, instance — is an identifier of at most
``MAX_TOKEN_LENGTH`` (128) characters, and every subject at most ``MAX_SUBJECT_LENGTH`` (1,024)
characters. A server closes the connection of a client whose subject overruns its protocol line
(4,096 bytes by default), so an unchecked long id would cost the caller every request in flight
and a reconnect; checked here, it is refused before anything is sent.
"""

from __future__ import annotations

import hashlib

from dataclasses import dataclass

from .ids import MAX_ID_LENGTH, is_identifier, split_thread_id

__all__ = [
    "DEFAULT_TENANT",
    "DEAD",
    "DEAD_STREAM",
    "EVENTS",
    "EVENTS_STREAM",
    "INSPECT",
    "MAX_SUBJECT_LENGTH",
    "MAX_TOKEN_LENGTH",
    "PARTITIONED",
    "PREPARE",
    "RECORDED",
    "StoredSubject",
    "check_subject",
    "check_tenant",
    "check_token",
    "dead_subject",
    "events_subject",
    "inspect_subject",
    "msg_id_of",
    "partition_filter",
    "partition_of",
    "partition_transform",
    "prepare_subject",
    "recorded_subject",
    "parse_stored_subject",
    "tenant_subject",
    "thread_from_partitioned_subject",
]

EVENTS = "ctx.events"
PARTITIONED = "ctx.p"
RECORDED = "ctx.recorded"
PREPARE = "ctx.prepare"
INSPECT = "ctx.inspect"
DEAD = "ctx.dead"

# The tenant of a fleet with one, and of events stored before subjects carried a tenant.
DEFAULT_TENANT = "default"

EVENTS_STREAM = "CTX_EVENTS"
DEAD_STREAM = "CTX_DEAD"

# The longest id one subject token may carry (``contracts.ids.ID_PATTERN``), and the longest subject:
# both well under the 4,096-byte protocol line past which a NATS server drops the connection.
MAX_TOKEN_LENGTH = MAX_ID_LENGTH
MAX_SUBJECT_LENGTH = 1024


def msg_id_of(thread_id: str, event_key: str, data: bytes) -> str:
    """The ``Nats-Msg-Id`` of an event: thread, key and a digest of the exact bytes.

    JetStream then drops only byte-identical retries. Anything else under a known key (a conflicting
    reuse, another session claiming the thread) reaches the recorder, which rejects it with a
    reason instead of the publisher being told "duplicate" and nothing else. The recorder checks
    the header against the body, so a publisher that derives it otherwise learns so from a dead
    letter on its first event, not from a silent duplicate later.
    """
    return f"{thread_id}/{event_key}/{hashlib.sha256(data).hexdigest()[:16]}"


def check_token(value: str, what: str) -> str:
    """``value`` if it can be one subject token (an identifier); raises ``ValueError`` naming ``what``."""
    if not is_identifier(value):
        raise ValueError(
            f"not a valid {what} (allowed: letters, digits, '_' and '-', 1-{MAX_ID_LENGTH}): {_shown(value)}"
        )
    return value


def check_subject(subject: str) -> str:
    """``subject`` if a server takes it; raises ``ValueError`` past ``MAX_SUBJECT_LENGTH``."""
    if len(subject) > MAX_SUBJECT_LENGTH:
        raise ValueError(f"subject of {len(subject)} characters; at most {MAX_SUBJECT_LENGTH} are allowed")
    return subject


def check_tenant(tenant: str) -> str:
    """``tenant`` if it can be one subject token; raises ``ValueError`` otherwise."""
    return check_token(tenant, "tenant")


def _shown(value: str) -> str:
    # An error message quotes at most the start of what it refuses (it may be megabytes).
    return repr(value) if len(value) <= 40 else f"{value[:40]!r}... ({len(value)} characters)"


def tenant_subject(base: str, tenant: str) -> str:
    """A request subject of one tenant: ``ctx.read`` → ``ctx.read.<tenant>``."""
    return f"{base}.{check_tenant(tenant)}"


def events_subject(tenant: str, session_id: str, thread_id: str) -> str:
    """Where a runtime of ``tenant`` publishes the events of ``thread_id`` in ``session_id``."""
    split_thread_id(thread_id)
    if session_id != "_":
        check_token(session_id, "session id")
    return f"{EVENTS}.{check_tenant(tenant)}.{session_id}.{thread_id}"


def prepare_subject(tenant: str, thread_id: str) -> str:
    """Where a runtime of ``tenant`` asks for the prepared context of ``thread_id`` (request/reply)."""
    split_thread_id(thread_id)
    return f"{PREPARE}.{check_tenant(tenant)}.{thread_id}"


def inspect_subject(tenant: str, thread_id: str) -> str:
    """Where an operator asks for the ledger view of ``thread_id`` of ``tenant`` (request/reply)."""
    split_thread_id(thread_id)
    return f"{INSPECT}.{check_tenant(tenant)}.{thread_id}"


def recorded_subject(thread_id: str) -> str:
    """Where the recorder announces that a thread's ledger moved (core NATS, a hint only)."""
    return f"{RECORDED}.{thread_id}"


def dead_subject(thread_id: str | None) -> str:
    """Where a rejected event goes; ``_`` stands for a message whose thread could not be read."""
    return f"{DEAD}.events.{thread_id or '_._'}"


def partition_of(session_id: str, *, partitions: int) -> int:
    """The partition the server assigns to a session: FNV-1a 32 over the session token, mod n.

    This mirrors nats-server's ``{{partition(n,2)}}`` so clients and tests can predict routing.
    """
    h = 0x811C9DC5
    for b in session_id.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def partition_transform(partitions: int) -> tuple[str, str]:
    """The ``(source, destination)`` subject transform of the events stream.

    The partition hashes the session token alone, so one session id is one writer's whatever
    tenant names it: the recorder can refuse a second tenant's claim without a race.
    """
    return (
        f"{EVENTS}.*.*.*.*",
        f"{PARTITIONED}.{{{{partition({partitions},2)}}}}"
        ".{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{wildcard(4)}}",
    )


def partition_filter(partition: int) -> str:
    """The filter subject of one partition's consumers.

    ``>`` rather than four ``*``: events stored before subjects carried a tenant (one token fewer)
    are still read, as the default tenant's.
    """
    return f"{PARTITIONED}.{partition}.>"


@dataclass(frozen=True, slots=True)
class StoredSubject:
    """What the server vouches for in a stored event's subject."""

    tenant: str
    session_id: str
    thread_id: str


def parse_stored_subject(subject: str) -> StoredSubject | None:
    """``ctx.p.<n>.<tenant>.<session>.<run>.<instance>`` (or the tenant-less form of older events)."""
    parts = subject.split(".")
    if ".".join(parts[:2]) != PARTITIONED:
        return None
    match len(parts):
        case 7:
            tenant, session, run, instance = parts[3:]
        case 6:
            tenant, (session, run, instance) = DEFAULT_TENANT, parts[3:]
        case _:
            return None
    if not is_identifier(tenant):
        return None
    return StoredSubject(tenant, session, f"{run}.{instance}")


def thread_from_partitioned_subject(subject: str) -> str | None:
    """The thread id carried by a stored subject."""
    stored = parse_stored_subject(subject)
    return stored.thread_id if stored else None
