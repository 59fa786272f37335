"""Wake-ups for prepares waiting on their watermark. In-process only; the shell feeds it.

A notice is a hint that a thread's ledger moved; waiters always re-check the database, so a lost
or duplicated notice can delay an answer (bounded by the re-check interval) but never falsify it.
The one exception is first-hand: this process's own recorder hands over, after its commit, the
event keys it committed (``recorded``), and a waiter for one of those needs no re-check (one
query less on every read-your-writes step). And while that recorder holds a batch with events
of a thread (``being_recorded``), a new waiter on the thread skips its first check too: the batch
ends with a wake-up of the thread's waiters whatever became of it (committed, rejected, skipped as
a duplicate, failed), and only then is the ledger asked — the check made meanwhile would race the
recorder's own statements for the same rows, on the read-your-writes path of every step.

The board also remembers the keys that recorder committed lately, per thread (``recent``: the last
``RECENT_KEYS`` of a thread, or its last batch's if more, for the threads recorded most lately, within
``RECENT_THREADS`` threads and ``RECENT_TOTAL_KEYS`` keys; design D14.25). A prepare naming one
of them needs no check at all; one naming another key of such a thread — its event most likely still
on its way to that recorder — waits a short grace for the handover before asking the ledger.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from typing import NamedTuple, Protocol

__all__ = [
    "NO_PAUSE",
    "Committed",
    "NoticeBoard",
    "Pause",
    "RECENT_KEYS",
    "RECENT_THREADS",
    "RECENT_TOTAL_KEYS",
    "Wakeup",
    "wait_for_notice",
]

# What the board remembers of its recorder's commits: enough keys per thread for a runtime retrying
# its last few steps — and every key of the thread's last batch, whose last event a replay or a burst
# names next — for as many threads as a process steps at once. At most 65,536 keys of a few dozen
# bytes: a few megabytes.
RECENT_THREADS = 4_096
RECENT_KEYS = 16
RECENT_TOTAL_KEYS = 65_536


class Pause(Protocol):
    """What a request gives back while it only waits: the shell's compute slot, taken again after."""

    def released(self) -> AbstractAsyncContextManager[None]:
        """Hold no slot for the duration of the block."""
        ...


class _NoPause:
    @asynccontextmanager
    async def released(self) -> AsyncIterator[None]:
        yield


# For callers without admission control (tests, tools): waiting gives nothing back.
NO_PAUSE: Pause = _NoPause()


async def wait_for_notice(woken: asyncio.Event, timeout: float, pause: Pause) -> None:
    """Wait until ``woken`` is set or ``timeout`` seconds pass, holding no slot meanwhile.

    A waiting request must not keep an unrelated one from computing: ten prepares waiting out
    their ``wait_ms`` would otherwise fill the process's slots and starve everyone else.
    """
    async with pause.released():
        try:
            await asyncio.wait_for(woken.wait(), timeout=timeout)
        except TimeoutError:
            pass


class Committed(NamedTuple):
    """An event this process's recorder committed: the thread seq its batch moved the head to (None: not
    said), and the content hash it was recorded with (a prepare naming another hash is refused)."""

    through: int | None
    content_sha256: str


class Wakeup(asyncio.Event):
    """Set on every notice of a waiter's thread; also gathers what this process's recorder reported
    committed to it while the waiter waited."""

    def __init__(self) -> None:
        super().__init__()
        # (tenant, event key) pairs committed: only ever filled after the commit, by the recorder.
        self.recorded: dict[tuple[str, str], Committed] = {}


def _nothing_recorded(thread_id: str) -> bool:
    return False


class NoticeBoard:
    """Threads → the events of everyone waiting on them."""

    def __init__(
        self,
        changed: Callable[[str], None] | None = None,
        moved: Callable[[str, int], None] | None = None,
    ) -> None:
        self._waiters: defaultdict[str, list[Wakeup]] = defaultdict(list)
        self._recording: Callable[[str], bool] = _nothing_recorded
        # Thread → (tenant, event key) → what ``recorded`` was told of it; both least recently recorded
        # first.
        self._recent: OrderedDict[str, OrderedDict[tuple[str, str], Committed]] = OrderedDict()
        self._recent_keys = 0
        # Told of every notice too: a view this process trusts stops being trusted on it, ahead of
        # the database's own announcement (D14.17) — or, told the head's new revision, only a view
        # older than it does (``moved``: a view extended to that head stays, D14.21).
        self._changed = changed
        self._moved = moved

    def follow_recorder(self, is_recording: Callable[[str], bool]) -> None:
        """Ask ``is_recording(thread_id)`` whether this process's recorder holds a batch of a thread;
        that recorder must wake the thread's waiters (``notify``) when it lets the batch go."""
        self._recording = is_recording

    def being_recorded(self, thread_id: str) -> bool:
        """Whether this process's recorder holds a batch with events of ``thread_id`` right now."""
        return self._recording(thread_id)

    @contextmanager
    def waiting(self, thread_id: str) -> Iterator[Wakeup]:
        """Register interest in a thread for the duration of the block."""
        event = Wakeup()
        self._waiters[thread_id].append(event)
        try:
            yield event
        finally:
            waiters = self._waiters.get(thread_id)
            if waiters is not None:
                waiters.remove(event)
                if not waiters:
                    del self._waiters[thread_id]

    def notify(self, thread_id: str) -> None:
        """``thread_id`` changed: wake everyone waiting on it."""
        if self._changed is not None:
            self._changed(thread_id)
        self.wake(thread_id)

    def wake(self, thread_id: str) -> None:
        """Wake everyone waiting on ``thread_id``, which did not change (the recorder let go of a batch
        whose commit, if any, it announced already: a change here would end the view it extended)."""
        for event in self._waiters.get(thread_id, ()):
            event.set()

    def recorded(
        self,
        thread_id: str,
        tenant: str,
        event_keys: Mapping[str, str],
        head: tuple[int, int] | None = None,
    ) -> None:
        """This process's recorder committed ``event_keys`` of ``tenant`` (each with its content hash) to
        ``thread_id``, moving its head to ``head`` (last seq, revision) if given: wake its waiters,
        telling them which keys need no re-check, through which seq the ledger holds them and with which
        content. Only a recorder, after its commit, may say so."""
        if head is not None and head[1] >= 0 and self._moved is not None:
            self._moved(thread_id, head[1])
        elif self._changed is not None:
            self._changed(thread_id)
        through = head[0] if head is not None and head[0] >= 0 else None
        if event_keys:
            self._remember(thread_id, tenant, event_keys, through)
        for event in self._waiters.get(thread_id, ()):
            event.recorded.update(((tenant, key), Committed(through, sha)) for key, sha in event_keys.items())
            event.set()

    def recent(self, thread_id: str) -> Mapping[tuple[str, str], Committed] | None:
        """The (tenant, event key) pairs this process's recorder committed lately to ``thread_id``, each
        with the thread seq through which the ledger holds it and its content hash; None when it
        committed nothing of the thread lately (another process may be recording it)."""
        return self._recent.get(thread_id)

    def _remember(
        self, thread_id: str, tenant: str, event_keys: Mapping[str, str], through: int | None
    ) -> None:
        keys = self._recent.get(thread_id)
        if keys is None:
            keys = self._recent[thread_id] = OrderedDict()
        else:
            self._recent.move_to_end(thread_id)
        before = len(keys)
        for key, sha in event_keys.items():
            keys[(tenant, key)] = Committed(through, sha)
            keys.move_to_end((tenant, key))
        # The batch's keys came last: trimming from the front keeps all of them.
        while len(keys) > max(RECENT_KEYS, len(event_keys)):
            keys.popitem(last=False)
        self._recent_keys += len(keys) - before
        while len(self._recent) > RECENT_THREADS or self._recent_keys > RECENT_TOTAL_KEYS:
            _, dropped = self._recent.popitem(last=False)
            self._recent_keys -= len(dropped)

    @property
    def waiting_threads(self) -> int:
        """How many threads have waiters (for metrics)."""
        return len(self._waiters)
