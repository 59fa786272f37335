"""The recorder's check that its committed positions still describe the events stream.

JetStream acks a publish whatever the recorder does, so a stream that lost its store and restarted
its sequences below the committed positions would be read from ``position + 1`` and its first
events silently skipped. The guard compares, at most every ``every_s`` seconds (and afresh after
each consumer is bound, the one moment a stale position can be turned into a consumer), the stream's
state with the positions in Postgres (``services.core.baseline.check_stream``). A halt is sticky: it
lasts until the positions in Postgres change, which only ``ctxfleet rebaseline`` does while halted,
so a stream that grows back past the old positions does not quietly resume recording.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.js import JetStreamContext

from contracts.subjects import EVENTS_STREAM
from services.core.baseline import Positions, StreamFacts, StreamVerdict, check_stream, plan_truncation
from services.store.postgres import PgStore

from .metrics import FleetMetrics

__all__ = ["DEFAULT_CHECK_EVERY_S", "StreamGuard"]


class _Moved(Exception):
    """Positions moved while a lost tail was being repaired: another recorder did it; check again."""


log = logging.getLogger("ctxfleet.recorder")
DEFAULT_CHECK_EVERY_S = 2.0


class StreamGuard:
    """Decides, from the stream and Postgres, whether the recorder may record; shared by all partitions."""

    def __init__(
        self,
        js: JetStreamContext,
        store: PgStore,
        metrics: FleetMetrics,
        *,
        consumer: str = "recorder",
        every_s: float = DEFAULT_CHECK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._js = js
        self._store = store
        self._metrics = metrics
        self._consumer = consumer
        self._clock = clock
        self.every_s = every_s
        self._lock = asyncio.Lock()
        # Attempts pace the checks (a failing one too); only a success counts for ``since``.
        self._attempted_at: float | None = None
        self._verified_at: float | None = None
        self._verdict: StreamVerdict | None = None
        # What Postgres said when we halted: the halt holds until it changes (an operator acted).
        self._halted_on: Positions | None = None
        # Bumped whenever positions are lowered: consumers bound before must be rebuilt from Postgres.
        self.epoch = 0

    @property
    def verdict(self) -> StreamVerdict | None:
        """The last decision, ``None`` before the first check succeeded."""
        return self._verdict

    @property
    def halt_reason(self) -> str | None:
        return self._verdict.reason if self._verdict is not None else None

    async def check(self, *, since: float | None = None) -> StreamVerdict:
        """The current decision, re-checked if last tried ``every_s`` ago, or not verified since ``since``.

        Concurrent callers share one check, so partitions add no JetStream calls of their own. A
        failed check raises once and is not retried before ``every_s``; meanwhile callers without
        ``since`` get the last decision.
        """
        async with self._lock:
            if since is not None:
                if self._verified_at is None or self._verified_at < since:
                    await self._refresh()
            elif (
                self._verdict is None
                or self._attempted_at is None
                or self._clock() - self._attempted_at >= self.every_s
            ):
                await self._refresh()
            assert self._verdict is not None
            return self._verdict

    def now(self) -> float:
        """The guard's clock (for ``check(since=...)``)."""
        return self._clock()

    async def _refresh(self) -> None:
        started = self._clock()
        self._attempted_at = started
        # Positions first: a position read now is a message the stream held by now, so a stream state
        # read after it can only be at or past it unless the stream really lost it. The other order
        # races a busy recorder (seq 1206 recorded between the two reads looked like a lost tail).
        positions = await self._store.positions(self._consumer, EVENTS_STREAM)
        info = await self._js.stream_info(EVENTS_STREAM)
        if info.created is None:  # every server we support (>= 2.10) reports it
            raise RuntimeError(f"{EVENTS_STREAM}: the server reported no creation time")
        stream = StreamFacts(EVENTS_STREAM, info.state.first_seq, info.state.last_seq, info.created)
        verdict = check_stream(positions, stream)
        if verdict.kind == "truncated":
            try:
                await self._repair_truncation(positions, verdict)
            except _Moved:
                pass
            self.epoch += 1  # either way, positions went down: consumers bound before are stale
            positions = await self._store.positions(self._consumer, EVENTS_STREAM)
            verdict = check_stream(positions, stream)
        if self._halted_on is not None and positions == self._halted_on:
            # Nothing changed in Postgres since the halt: stay halted whatever the stream did since.
            verdict = self._verdict if self._verdict is not None else verdict
        elif verdict.kind == "adopt":
            await self._store.adopt_stream(EVENTS_STREAM, stream.created, replacing=positions.created)
            log.info(
                "recorder: positions describe %s created at %s; recorded its identity",
                EVENTS_STREAM,
                stream.created,
            )
        self._note(verdict, positions)
        self._verified_at = started

    async def _repair_truncation(self, positions: Positions, verdict: StreamVerdict) -> None:
        """Lower the positions past a lost tail to the stream's end (``_Moved`` if they changed meanwhile)."""
        resets = plan_truncation(positions, verdict)
        s = verdict.stream
        async with self._store.locked_positions(self._consumer, EVENTS_STREAM) as locked:
            repaired = locked.positions == positions and await locked.lower(s.created, resets)
            if not repaired:
                # Another recorder repaired it (or a position moved): roll back, read again.
                raise _Moved()
        lost_to = max(r.old for r in resets)
        self._metrics.stream_truncations.inc()
        log.error(
            "events stream %s lost its tail (last seq %d < committed positions up to %d, partitions %s): "
            "the broker acked seqs %d..%d and lost them; those the recorder had read are in the ledger, "
            "any other is gone. Positions lowered to %d: the next publish is read as seq %d",
            s.name,
            s.last_seq,
            lost_to,
            ", ".join(str(r.partition) for r in resets),
            s.last_seq + 1,
            lost_to,
            s.last_seq,
            s.last_seq + 1,
        )

    def _note(self, verdict: StreamVerdict, positions: Positions) -> None:
        was = self._verdict.halted if self._verdict is not None else False
        if verdict.halted and not was:
            self._halted_on = positions
            log.error("recorder halted: %s", verdict.reason)
        elif was and not verdict.halted:
            self._halted_on = None
            log.warning(
                "recorder resumes: positions re-baselined onto %s created at %s",
                verdict.stream.name,
                verdict.stream.created,
            )
        self._metrics.recorder_halted.set(1 if verdict.halted else 0)
        self._verdict = verdict
