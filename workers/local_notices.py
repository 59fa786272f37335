"""Recorder notices fanned out inside one process.

Through the broker, a prepare waiting for its event in the process that also records it would learn
of the commit only once the recorder's ``ctx.recorded.<thread>`` came back to the same process
through FastStream: a round trip and a decode on the read-your-writes path of every step.
Here the recorder hands the thread to this process's listeners directly, right after the commit.

It still publishes every notice on NATS, for the workers of other processes, on the process's
broker connection, which does not echo what it publishes (``no_echo``): the copies never come back
here. They carry this process's origin token in the ``ctx-origin`` header as well, and a subscriber
here skips a copy it already got (a recorder publishing on a connection of its own), so a budgeter or
indexer never runs a second pass for one batch. Either way a notice stays a hint:
waiters re-check the ledger and the sweeps catch up on whatever a lost notice did not announce.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

from nats.nuid import NUID

from services.core.advances import HeadAdvance

__all__ = ["ORIGIN_HEADER", "LocalNotices"]

ORIGIN_HEADER = "ctx-origin"
# No keys committed (the thread's events were only rejected or skipped).
_NO_KEYS: Mapping[str, str] = MappingProxyType({})


class LocalNotices:
    """The listeners of one process for its own recorder's notices."""

    def __init__(self, origin: str | None = None) -> None:
        self.origin = origin or NUID().next().decode()
        self._listeners: list[Callable[[str], None]] = []
        self._key_listeners: list[Callable[[str, str, Mapping[str, str], tuple[int, int] | None], None]] = []
        self._advance_listeners: list[Callable[[HeadAdvance], object]] = []
        self._release_listeners: list[Callable[[str], None]] = []
        # Threads with events in a batch the recorder holds (a count: partitions hold batches at once).
        self._holding: Counter[str] = Counter()

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(thread_id)`` for every thread this process's recorder moves."""
        self._listeners.append(listener)

    def listen_recorded(
        self, listener: Callable[[str, str, Mapping[str, str], tuple[int, int] | None], None]
    ) -> None:
        """Call ``listener(thread_id, tenant, event_keys, head)`` for every thread this process's
        recorder moves, with the keys it committed, each with its content hash (none when it only
        rejected or skipped events), and the head it moved the thread to: (last seq, revision), (-1, -1)
        for none."""
        self._key_listeners.append(listener)

    def listen_advanced(self, listener: Callable[[HeadAdvance], object]) -> None:
        """Call ``listener(advance)`` for every head this process's recorder moved with a batch that
        wrote nothing else a view reads, before the thread's other listeners hear of it (D14.21)."""
        self._advance_listeners.append(listener)

    def announce(
        self,
        thread_id: str,
        tenant: str = "",
        event_keys: Mapping[str, str] = _NO_KEYS,
        head: tuple[int, int] | None = None,
        advance: HeadAdvance | None = None,
    ) -> None:
        """Tell this process's listeners that ``thread_id`` moved, and which keys of ``tenant`` it
        committed there (with their content hashes) with its head moving to ``head`` (last seq,
        revision) (after the commit: a listener may rely on them)."""
        if advance is not None:
            for advance_listener in self._advance_listeners:
                advance_listener(advance)
        for listener in self._listeners:
            listener(thread_id)
        for key_listener in self._key_listeners:
            key_listener(thread_id, tenant, event_keys, head)

    def listen_released(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(thread_id)`` for every thread of a batch this process's recorder lets go."""
        self._release_listeners.append(listener)

    @contextmanager
    def recording(self, thread_ids: Collection[str]) -> Iterator[None]:
        """This process's recorder holds a batch with events of ``thread_ids`` for the block; when it
        ends — announced, rejected, duplicate or failed — the release listeners hear of each thread."""
        self._holding.update(thread_ids)
        try:
            yield
        finally:
            self._holding.subtract(thread_ids)
            for thread_id in thread_ids:
                if self._holding[thread_id] <= 0:
                    del self._holding[thread_id]
            for thread_id in thread_ids:
                for listener in self._release_listeners:
                    listener(thread_id)

    def is_recording(self, thread_id: str) -> bool:
        """Whether this process's recorder holds a batch with events of ``thread_id``."""
        return thread_id in self._holding

    def is_own(self, headers: Mapping[str, str] | None) -> bool:
        """Whether a notice received from NATS came from this process (and was handed over already)."""
        return headers is not None and headers.get(ORIGIN_HEADER) == self.origin

    @property
    def headers(self) -> dict[str, str]:
        """The headers of a notice this process publishes."""
        return {ORIGIN_HEADER: self.origin}
