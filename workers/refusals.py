"""What the stores refused this process lately, so readiness can say why nothing is being stored.

A full or read-only disk shows only when something is written: JetStream answers a publish
``insufficient resources`` (503), PostgreSQL fails a write with a SQLSTATE of class 53 (resources)
or 25 (read-only). The writers of this process (the compaction-job queue, the dead-letter sink,
the recorder) report each refusal and each success here; readiness reports a store's refusal
until a later write to that store succeeds, or until no refusal was seen for ``fresh_s`` (nothing
tried since, so the refusal no longer says anything about now).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.js.errors import APIError

__all__ = ["Refusals", "describe_publish_failure"]

# Writers retry a refused write within seconds (the recorder's backoff, the budgeter's sweep):
# a refusal this old with none since means nothing tried again, not that the store still refuses.
_FRESH_S = 30.0


@dataclass
class _Refusal:
    why: str
    at: float


class Refusals:
    """The latest refusal of each store, until a write to it succeeds again."""

    def __init__(self, fresh_s: float = _FRESH_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._fresh_s = fresh_s
        self._clock = clock
        self._latest: dict[str, _Refusal] = {}

    def refused(self, store: str, why: str) -> None:
        """``store`` (``jetstream``, ``postgres``) refused a write, for reason ``why``."""
        self._latest[store] = _Refusal(why, self._clock())

    def stored(self, store: str) -> None:
        """A write to ``store`` succeeded: it takes writes again."""
        self._latest.pop(store, None)

    def why(self, store: str) -> str | None:
        """Why ``store`` does not take writes, as far as this process saw lately; ``None`` if it does."""
        refusal = self._latest.get(store)
        if refusal is None:
            return None
        age = self._clock() - refusal.at
        if age > self._fresh_s:
            return None
        return f"{refusal.why} (a write refused {age:.0f}s ago)"


def describe_publish_failure(exc: NatsError | TimeoutError) -> str:
    """A JetStream publish's failure in a few words: ``insufficient resources (503)``, a timeout."""
    if isinstance(exc, APIError):
        return f"{exc.description or 'refused'} ({exc.code})"
    if isinstance(exc, TimeoutError):
        # What a store that met a full or read-only disk answers: nothing.
        return "no acknowledgement in time"
    return type(exc).__name__
