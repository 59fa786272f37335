"""Where the recorder stands: partition positions and the stream identity they were read from, and the
dead letters of what it refused."""

from __future__ import annotations

import json
from datetime import datetime
from collections.abc import Sequence


from contracts import InspectedDeadLetter
from contracts.subjects import DEFAULT_TENANT, parse_stored_subject

from services.core.baseline import PositionReset, Positions
from services.core.hashing import sha256_hex
from services.core.ledger import (
    Rejection,
    encode_raw,
)

from services.store.ledger import Conn

__all__ = [
    "TrackingRepo",
    "count_dead_letters",
    "insert_dead_letter",
    "recent_dead_letters",
]


_INSERT_DEAD = """
INSERT INTO ctx.dead_letters (thread_id, event_key, code, reason, details, subject, stream_seq,
                              raw_sha256, raw_size, raw, raw_truncated, tenant, named_thread_id)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11, $12, $13)
ON CONFLICT ON CONSTRAINT dead_letters_once DO NOTHING
"""


_UPSERT_TRACKING = """
INSERT INTO ctx.tracking (consumer, partition, last_stream_seq) VALUES ($1, $2, $3)
ON CONFLICT (consumer, partition) DO UPDATE
SET last_stream_seq = GREATEST(ctx.tracking.last_stream_seq, EXCLUDED.last_stream_seq), updated_at = now()
"""


_SELECT_TRACKING = "SELECT last_stream_seq FROM ctx.tracking WHERE consumer = $1 AND partition = $2"


_SELECT_POSITIONS = "SELECT partition, last_stream_seq FROM ctx.tracking WHERE consumer = $1"


_SELECT_POSITIONS_FOR_UPDATE = _SELECT_POSITIONS + " FOR UPDATE"


_SELECT_BASELINE = "SELECT created FROM ctx.stream_baselines WHERE stream = $1"


_SELECT_BASELINE_FOR_UPDATE = _SELECT_BASELINE + " FOR UPDATE"


_INSERT_BASELINE = (
    "INSERT INTO ctx.stream_baselines (stream, created) VALUES ($1, $2) ON CONFLICT (stream) DO NOTHING"
)


# Compare-and-set: only replaces the identity the caller saw, so two recorders cannot flip-flop it.
_REPLACE_BASELINE = """
UPDATE ctx.stream_baselines SET created = $2, updated_at = now() WHERE stream = $1 AND created = $3
"""


_UPSERT_BASELINE = """
INSERT INTO ctx.stream_baselines (stream, created) VALUES ($1, $2)
ON CONFLICT (stream) DO UPDATE SET created = EXCLUDED.created, updated_at = now()
"""


# The one write that moves a position backwards (insert_tracking never does); only a re-baseline may.
_RESET_TRACKING = """
UPDATE ctx.tracking SET last_stream_seq = $3, updated_at = now()
WHERE consumer = $1 AND partition = $2 AND last_stream_seq = $4
"""


# Filed under the thread, or naming it from another thread's subject (``named_thread_id``).
_COUNT_DEAD = "SELECT count(*) FROM ctx.dead_letters WHERE thread_id = $1"
_RECENT_DEAD = """
SELECT stream_seq, event_key, code, reason FROM ctx.dead_letters
WHERE thread_id = $1 ORDER BY id DESC LIMIT $2
"""


async def insert_dead_letter(conn: Conn, rejection: Rejection, *, keep_raw: int) -> None:
    """Store one rejection; a redelivered one is stored once."""
    raw = rejection.incoming.data
    _, truncated = encode_raw(raw, keep_raw)
    await conn.execute(
        _INSERT_DEAD,
        rejection.thread_id,
        rejection.event_key,
        rejection.code.value,
        rejection.reason,
        json.dumps(rejection.details),
        rejection.incoming.subject,
        rejection.incoming.stream_seq,
        sha256_hex(raw),
        len(raw),
        raw[:keep_raw],
        truncated,
        stored.tenant if (stored := parse_stored_subject(rejection.incoming.subject)) else DEFAULT_TENANT,
        rejection.named_thread,
    )


async def count_dead_letters(conn: Conn, thread_id: str) -> int:
    return int(await conn.fetchval(_COUNT_DEAD, thread_id))


async def recent_dead_letters(conn: Conn, thread_id: str, limit: int) -> list[InspectedDeadLetter]:
    """A thread's newest rejections, newest first."""
    return [
        InspectedDeadLetter(
            stream_seq=r["stream_seq"], event_key=r["event_key"], code=r["code"], reason=r["reason"]
        )
        for r in await conn.fetch(_RECENT_DEAD, thread_id, limit)
    ]


class TrackingRepo:
    """How far each consumer has applied each partition, written with the effect it tracks."""

    @staticmethod
    async def insert_tracking(conn: Conn, consumer: str, partition: int, stream_seq: int) -> None:
        """Advance the position (never backwards)."""
        await conn.execute(_UPSERT_TRACKING, consumer, partition, stream_seq)

    @staticmethod
    async def max_tracking_seq(conn: Conn, consumer: str, partition: int) -> int:
        """The last stream sequence applied, 0 if none."""
        return int(await conn.fetchval(_SELECT_TRACKING, consumer, partition) or 0)

    @staticmethod
    async def select_positions(
        conn: Conn, consumer: str, stream: str, *, for_update: bool = False
    ) -> Positions:
        """Every partition's position and the identity of the stream they were read from.

        Call it in a transaction (repeatable read, or ``for_update`` to re-baseline) so both halves
        are one snapshot.
        """
        rows = await conn.fetch(_SELECT_POSITIONS_FOR_UPDATE if for_update else _SELECT_POSITIONS, consumer)
        created = await conn.fetchval(_SELECT_BASELINE_FOR_UPDATE if for_update else _SELECT_BASELINE, stream)
        return Positions({int(r["partition"]): int(r["last_stream_seq"]) for r in rows}, created)

    @staticmethod
    async def adopt_stream(conn: Conn, stream: str, created: datetime, *, replacing: datetime | None) -> bool:
        """Record ``created`` as the stream's identity if it is still ``replacing``; whether it was."""
        if replacing is None:
            status = await conn.execute(_INSERT_BASELINE, stream, created)
        else:
            status = await conn.execute(_REPLACE_BASELINE, stream, created, replacing)
        return str(status).endswith(" 1")

    @staticmethod
    async def reset_positions(
        conn: Conn, consumer: str, stream: str, created: datetime, resets: Sequence[PositionReset]
    ) -> bool:
        """Move positions back to where a re-baseline says and record the stream's identity.

        Returns ``False`` (and the caller rolls back) when a position is no longer what was read.
        """
        for reset in resets:
            status = await conn.execute(_RESET_TRACKING, consumer, reset.partition, reset.new, reset.old)
            if not str(status).endswith(" 1"):
                return False
        await conn.execute(_UPSERT_BASELINE, stream, created)
        return True
