"""The recorder's check that its committed positions still describe the events stream.

JetStream acks a publish whatever the recorder does, so a stream that lost its store and restarted
its sequences below the committed positions would be read from ``position + 1`` and its first
events silently skipped. The guard compares, at most every ``every_s`` seconds (and afresh after
each consumer is bound, the one moment a stale position can be turned into a consumer), the stream's
state with the positions in Postgres (``services.baseline.check_stream``). A halt is sticky: it
lasts until the positions in Postgres change, which only ``ctxfleet rebaseline`` does while halted,
so a stream that grows back past the old positions does not quietly resume recording.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import asyncpg
from nats.js import JetStreamContext

from contracts.subjects import EVENTS_STREAM
from services.baseline import Positions, StreamFacts, StreamVerdict, check_stream
from services.store.ledger import TrackingRepo

from .metrics import FleetMetrics

__all__ = ["DEFAULT_CHECK_EVERY_S", "StreamGuard"]

log = logging.getLogger("ctxfleet.recorder")
DEFAULT_CHECK_EVERY_S = 2.0


class StreamGuard:
    """Decides, from the stream and Postgres, whether the recorder may record; shared by all partitions."""

    def __init__(
        self,
        js: JetStreamContext,
        pool: asyncpg.Pool,
        metrics: FleetMetrics,
        *,
        consumer: str = "recorder",
        every_s: float = DEFAULT_CHECK_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._js = js
        self._pool = pool
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

    @property
    def verdict(self) -> StreamVerdict | None:
        """The last decision, ``None`` before the first check succeeded."""
        return self._verdict

    @property
    def halt_reason(self) -> str | None:
        """Why nothing is being recorded, or ``None``."""
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
            elif self._verdict is None or self._attempted_at is None or self._clock() - self._attempted_at >= self.every_s:
                await self._refresh()
            assert self._verdict is not None
            return self._verdict

    def now(self) -> float:
        """The guard's clock (for ``check(since=...)``)."""
        return self._clock()

    async def _refresh(self) -> None:
        started = self._clock()
        self._attempted_at = started
        info = await self._js.stream_info(EVENTS_STREAM)
        if info.created is None:  # every server we support (>= 2.10) reports it
            raise RuntimeError(f"{EVENTS_STREAM}: the server reported no creation time")
        stream = StreamFacts(EVENTS_STREAM, info.state.first_seq, info.state.last_seq, info.created)
        async with self._pool.acquire() as conn:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                positions = await TrackingRepo.select_positions(conn, self._consumer, EVENTS_STREAM)
        verdict = check_stream(positions, stream)
        if self._halted_on is not None and positions == self._halted_on:
            # Nothing changed in Postgres since the halt: stay halted whatever the stream did since.
            verdict = self._verdict if self._verdict is not None else verdict
        elif verdict.kind == "adopt":
            async with self._pool.acquire() as conn:
                await TrackingRepo.adopt_stream(conn, EVENTS_STREAM, stream.created, replacing=positions.created)
            log.info("recorder: positions describe %s created at %s; recorded its identity", EVENTS_STREAM, stream.created)
        self._note(verdict, positions)
        self._verified_at = started

    def _note(self, verdict: StreamVerdict, positions: Positions) -> None:
        was = self._verdict.halted if self._verdict is not None else False
        if verdict.halted and not was:
            self._halted_on = positions
            log.error("recorder halted: %s", verdict.reason)
        elif was and not verdict.halted:
            self._halted_on = None
            log.warning("recorder resumes: positions re-baselined onto %s created at %s", verdict.stream.name, verdict.stream.created)
        self._metrics.recorder_halted.set(1 if verdict.halted else 0)
        self._verdict = verdict
