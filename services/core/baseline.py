"""Whether the recorder's committed positions still describe the events stream.

A position in ``ctx.tracking`` is a stream sequence of one particular ``CTX_EVENTS`` stream. When
that stream is lost and provisioned anew (its JetStream store deleted) or restored to an older
state, its sequences restart: resuming a partition at ``position + 1`` would skip every event the
new stream holds below that position — acked by JetStream, yet never recorded nor dead-lettered.

Invariants (one function each below):

0. A stream of the recorded identity whose last sequence fell below committed positions lost its
   tail: a broker killed before it flushed what it had acked (a single node's store syncs
   asynchronously). That is repaired without anyone (``truncated``): every sequence up to the last
   one was applied, and the broker numbers the next publish ``last_seq + 1``, so the positions ahead
   are lowered to ``last_seq`` and nothing new is skipped. The sequences in between were acked and
   then lost by the broker; those the recorder had read are in the ledger, and the verdict names
   the range so the loss of any other is reported, never silent.
1. A committed position ahead of the stream's last sequence, of a stream whose identity was never
   recorded, halts recording (``went_backwards``): nothing tells a lost tail from another log.
2. A stream whose creation time differs from the one recorded with the positions halts recording
   (``recreated``), even when every position is below its last sequence: the sequences are those
   of another log.
3. With no committed position nothing can be skipped, so the current stream is adopted.
4. Positions recorded before stream identities were (no identity yet) adopt the current stream only
   when no position is ahead of it; otherwise invariant 1 halts.
5. A halt resets every committed position, not only those ahead of the stream: all partitions share
   one sequence space, so a position below the last sequence of a re-created stream is as wrong as
   one above it. Positions restart at ``first_seq - 1``; re-reading an event already in the ledger
   is a duplicate by event key, never a second record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, assert_never

__all__ = [
    "Positions",
    "PositionReset",
    "Rebaseline",
    "StreamFacts",
    "StreamVerdict",
    "VerdictKind",
    "check_stream",
    "plan_rebaseline",
    "plan_truncation",
]

VerdictKind = Literal["intact", "adopt", "truncated", "went_backwards", "recreated"]


@dataclass(frozen=True, slots=True)
class StreamFacts:
    """What JetStream says about the events stream right now."""

    name: str
    first_seq: int
    last_seq: int
    created: datetime


@dataclass(frozen=True, slots=True)
class Positions:
    """What Postgres says: committed positions by partition and the stream they were read from."""

    by_partition: Mapping[int, int]
    created: datetime | None

    @property
    def committed(self) -> dict[int, int]:
        """The partitions that recorded anything (a position of 0 read nothing yet)."""
        return {p: seq for p, seq in self.by_partition.items() if seq > 0}


@dataclass(frozen=True, slots=True)
class StreamVerdict:
    """Whether recording may go on, and if not, which partitions' positions are stale."""

    kind: VerdictKind
    stream: StreamFacts
    recorded_created: datetime | None
    affected: tuple[int, ...] = ()
    # The highest committed position and its partition: what the halt reason quotes.
    ahead: tuple[int, int] | None = None

    @property
    def halted(self) -> bool:
        """Whether nothing may be recorded until an operator re-baselines."""
        match self.kind:
            case "intact" | "adopt" | "truncated":
                return False
            case "went_backwards" | "recreated":
                return True
            case _:
                assert_never(self.kind)

    @property
    def reason(self) -> str | None:
        """One sentence for ``/readyz`` and the log, ``None`` when recording may go on."""
        s = self.stream
        match self.kind:
            case "intact" | "adopt" | "truncated":
                return None
            case "went_backwards":
                seq, partition = self.ahead or (0, -1)
                what = (
                    f"went backwards: last seq {s.last_seq} < committed position {seq} of partition "
                    f"{partition}"
                )
            case "recreated":
                was = self.recorded_created.isoformat() if self.recorded_created else "unknown"
                what = (
                    f"was recreated at {s.created.isoformat()} (positions were read from the stream "
                    f"created at {was})"
                )
                if self.ahead is not None and self.ahead[0] > s.last_seq:
                    what += (
                        f" and went backwards: last seq {s.last_seq} < committed position {self.ahead[0]} "
                        f"of partition {self.ahead[1]}"
                    )
            case _:
                assert_never(self.kind)
        return (
            f"events stream {s.name} {what}; nothing after it is being recorded; "
            "inspect, then run 'ctxfleet rebaseline'"
        )


@dataclass(frozen=True, slots=True)
class PositionReset:
    """One partition's position, before and after a re-baseline."""

    partition: int
    old: int
    new: int


@dataclass(frozen=True, slots=True)
class Rebaseline:
    """What ``ctxfleet rebaseline`` would do: reset these positions and record the stream's identity."""

    verdict: StreamVerdict
    resets: tuple[PositionReset, ...]

    @property
    def needed(self) -> bool:
        """Whether there is anything to write (a stale position, or an identity to record)."""
        return bool(self.resets) or self.verdict.kind == "adopt"


def check_stream(positions: Positions, stream: StreamFacts) -> StreamVerdict:
    """Decide whether ``positions`` still describe ``stream`` (invariants 1–4)."""
    committed = positions.committed
    if not committed:
        # Invariant 3: a fresh database, or one whose recorder never read anything.
        kind: VerdictKind = "intact" if positions.created == stream.created else "adopt"
        return StreamVerdict(kind, stream, positions.created)
    ahead = _highest(committed)
    if positions.created is not None and positions.created != stream.created:
        return StreamVerdict("recreated", stream, positions.created, tuple(sorted(committed)), ahead)
    if ahead[0] > stream.last_seq:
        if positions.created is not None:
            # Invariant 0: the same log, shorter; only the partitions past its end are affected.
            affected = tuple(sorted(p for p, seq in committed.items() if seq > stream.last_seq))
            return StreamVerdict("truncated", stream, positions.created, affected, ahead)
        # Invariant 1 (and 4 when no identity was recorded yet).
        return StreamVerdict("went_backwards", stream, positions.created, tuple(sorted(committed)), ahead)
    if positions.created is None:
        # Invariant 4: positions from before identities were recorded, all within this stream.
        return StreamVerdict("adopt", stream, None, (), ahead)
    return StreamVerdict("intact", stream, positions.created, (), ahead)


def plan_rebaseline(positions: Positions, stream: StreamFacts) -> Rebaseline:
    """The resets that make recording resume from the stream's beginning (invariant 5)."""
    verdict = check_stream(positions, stream)
    if not verdict.halted:
        return Rebaseline(verdict, ())
    start = max(0, stream.first_seq - 1)
    resets = tuple(PositionReset(p, seq, start) for p, seq in sorted(positions.committed.items()))
    return Rebaseline(verdict, resets)


def plan_truncation(positions: Positions, verdict: StreamVerdict) -> tuple[PositionReset, ...]:
    """For a ``truncated`` stream, the positions ahead of its last sequence lowered to it (invariant 0)."""
    if verdict.kind != "truncated":
        return ()
    last = verdict.stream.last_seq
    return tuple(PositionReset(p, seq, last) for p, seq in sorted(positions.committed.items()) if seq > last)


def _highest(committed: Mapping[int, int]) -> tuple[int, int]:
    """``(position, partition)`` of the furthest partition; ties go to the lowest partition."""
    partition = min(committed, key=lambda p: (-committed[p], p))
    return committed[partition], partition
