"""Which loaded views a prepare naming no event may serve without reading the ledger (design D14.17).

A view load is one statement (D14.3), but on an agent's step PostgreSQL's backend has idled for the
length of a model call, and waking it was half of a 50-message prepare's own time (D14.16). Every
commit that changes what a view is made of is announced on one channel (migrations 0021 and 0022:
triggers on the thread's, its session's and its run's tables) to a listener of the process. A view
loaded while that listener was up is served again until a change of its thread, session or run
arrives, the listener drops, or ``max_age_s`` passes — whichever comes first.

Soundness, in order of events: a load takes a ``TrustToken`` *before* its statement, so a commit
after its snapshot is announced after the token was taken and always counts against the view; a
commit before it may count too, which only costs one more read. What is not closed is the notice in
flight: a commit is announced to the listener as it commits, so a prepare that arrives in the same
instant may still be answered from the view before it (a prepare that names its event never is).
``max_age_s`` bounds how long anything else — a notice never sent — could stay unseen.

A head's move is announced with the revision it moved to (migration 0023): only a view held at an
older head stops being trusted. The process whose recorder made the move may first have extended its
held view to the new head with what the batch wrote (``extend``, design D14.21): that view keeps the
token of the load it was extended from, so nothing announced since that load is overlooked, and the
move's own notice, arriving before or after, does not end it.

A profile's calibration, which every trusted view is budgeted with, is announced the same way
(migration 0024, design D14.22): ``CalibrationCache`` holds a calibration read under a token for as
long as a view, until ``calibration_changed`` names its tenant and profile.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

__all__ = ["ChangeKind", "TrustToken", "ViewTrust"]

_V = TypeVar("_V")
ChangeKind = Literal["thread", "session", "run"]
# A head's move and a calibration's change, remembered beside the changes under key kinds of their own.
_HEAD: Literal["head"] = "head"
_CALIBRATION: Literal["calibration"] = "calibration"
_Kind = ChangeKind | Literal["head", "calibration"]


@dataclass(frozen=True, slots=True)
class TrustToken:
    """Taken before a load: the listener's life and the last change it had announced, and when."""

    epoch: int
    seq: int
    at: float


@dataclass(frozen=True, slots=True)
class _Held(Generic[_V]):
    token: TrustToken
    session_id: str
    run_id: str | None
    view: _V
    # The head revision the view is at.
    revision: int


class ViewTrust(Generic[_V]):
    """Views by thread, each trusted until a change of its thread, session or run is announced.

    ``max_age_s`` 0 turns trust off (every prepare reads the ledger). Changes are remembered per key
    for the last ``max_changes`` keys; a view older than the oldest forgotten change is not trusted.
    """

    def __init__(
        self,
        *,
        max_age_s: float,
        max_views: int = 1024,
        max_changes: int = 65_536,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_age_s = max_age_s
        self._max_views = max_views
        self._max_changes = max_changes
        self._clock = clock
        self._listening = False
        self._epoch = 0
        self._seq = 0
        self._floor = 0
        self._changes: OrderedDict[tuple[_Kind, str], int] = OrderedDict()
        # The newest revision announced of each head in ``_changes``.
        self._heads: dict[str, int] = {}
        self._views: OrderedDict[str, _Held[_V]] = OrderedDict()
        # For metrics: prepares answered from a held view, changes announced, views extended.
        self.served = 0
        self.changes = 0
        self.extended = 0

    @property
    def enabled(self) -> bool:
        """Whether a load made now may be trusted: trust is on and the listener is up."""
        return self._listening and self._max_age_s > 0

    def listening(self) -> None:
        """The listener is (again) up: what is loaded from now on may be trusted."""
        self._epoch += 1
        self._listening = True

    def deaf(self) -> None:
        """The listener is down: changes may go unannounced, so nothing held is trusted any more."""
        self._epoch += 1
        self._listening = False
        self._views.clear()

    def changed(self, kind: ChangeKind, key: str) -> None:
        """A commit changed something of a thread, a session or a run (or a notice of this process says
        so, ahead of the listener's)."""
        self._remember(kind, key)
        if kind == "thread":
            self._views.pop(key, None)

    def head_moved(self, thread_id: str, revision: int) -> None:
        """A commit moved a thread's head to ``revision``: a view held at an older head is not trusted."""
        self._remember(_HEAD, thread_id)
        self._heads[thread_id] = max(revision, self._heads.get(thread_id, 0))

    def calibration_changed(self, tenant: str, profile: str) -> None:
        """A commit changed the calibration of a tenant's profile: one read before it is not trusted."""
        self._remember(_CALIBRATION, _calibration_key(tenant, profile))

    def _remember(self, kind: _Kind, key: str) -> None:
        self.changes += 1
        self._seq += 1
        at = (kind, key)
        self._changes[at] = self._seq
        self._changes.move_to_end(at)
        while len(self._changes) > self._max_changes:
            (forgotten, key_of), seq = self._changes.popitem(last=False)
            if forgotten == _HEAD:
                self._heads.pop(key_of, None)
            self._floor = max(self._floor, seq)

    def everything_changed(self) -> None:
        """A notice this process cannot attribute: nothing held before it is trusted."""
        self._seq += 1
        self._floor = self._seq
        self._views.clear()

    def token(self) -> TrustToken | None:
        """Taken before a load; ``None`` when no view loaded now may be trusted."""
        return TrustToken(self._epoch, self._seq, self._clock()) if self.enabled else None

    def keep(
        self,
        token: TrustToken | None,
        thread_id: str,
        session_id: str,
        run_id: str | None,
        view: _V,
        revision: int,
    ) -> None:
        """Hold the view at head ``revision`` a load that took ``token`` made, if nothing of it changed
        since."""
        if token is None or not self._current(token):
            return
        if not self._unchanged(token, thread_id, session_id, run_id, revision):
            return
        held = self._views.get(thread_id)
        if held is not None and (held.token.seq > token.seq or held.revision > revision):
            return  # a load that began after this one's changes were announced holds a newer view
        self._hold(thread_id, _Held(token, session_id, run_id, view, revision))

    def extend(
        self, thread_id: str, from_revision: int, revision: int, build: Callable[[_V], _V | None]
    ) -> bool:
        """Hold, at head ``revision``, what ``build`` makes of the view held at ``from_revision`` — a
        commit of this process's recorder moved the head between them and wrote nothing else a view
        reads (D14.21) — if that view is still trusted but for the move. False if nothing was held."""
        held = self._views.get(thread_id)
        if held is None or held.revision != from_revision or not self._current(held.token):
            return False
        if not self._unchanged(held.token, thread_id, held.session_id, held.run_id, revision):
            return False
        extended = build(held.view)
        if extended is None:
            return False
        self._hold(thread_id, _Held(held.token, held.session_id, held.run_id, extended, revision))
        self.extended += 1
        return True

    def _hold(self, thread_id: str, held: _Held[_V]) -> None:
        self._views[thread_id] = held
        self._views.move_to_end(thread_id)
        while len(self._views) > self._max_views:
            self._views.popitem(last=False)

    def view(self, thread_id: str, *, accept: Callable[[_V], bool] | None = None) -> _V | None:
        """The thread's held view, if it is still trusted (and ``accept`` takes it: a view it declines
        stays held, unserved)."""
        held = self._views.get(thread_id)
        if held is None:
            return None
        token = held.token
        if not self._current(token) or not self._unchanged(
            token, thread_id, held.session_id, held.run_id, held.revision
        ):
            del self._views[thread_id]
            return None
        if accept is not None and not accept(held.view):
            return None
        self.served += 1
        return held.view

    def calibration_current(self, token: TrustToken, tenant: str, profile: str) -> bool:
        """Whether a calibration read after ``token`` was taken is still what the store holds: the
        listener has stayed up, nothing unattributable was announced, its own change was not, and it
        is younger than ``max_age_s``."""
        if not self._current(token) or token.seq < self._floor:
            return False
        return self._changes.get((_CALIBRATION, _calibration_key(tenant, profile)), 0) <= token.seq

    def due(self, thread_id: str) -> bool:
        """Whether the thread's held view is past half its age: time to load it again, off the hot path,
        so that a thread in use never reaches ``max_age_s`` on a prepare's time."""
        held = self._views.get(thread_id)
        return held is not None and self._clock() - held.token.at > self._max_age_s / 2

    def forget(self, thread_id: str) -> None:
        """Stop holding a thread's view (its records left the view cache)."""
        self._views.pop(thread_id, None)

    def __len__(self) -> int:
        return len(self._views)

    def _current(self, token: TrustToken) -> bool:
        return self.enabled and token.epoch == self._epoch and self._clock() - token.at <= self._max_age_s

    def _unchanged(
        self, token: TrustToken, thread_id: str, session_id: str, run_id: str | None, revision: int
    ) -> bool:
        if token.seq < self._floor:
            return False
        changes = self._changes
        if changes.get(("thread", thread_id), 0) > token.seq:
            return False
        if changes.get((_HEAD, thread_id), 0) > token.seq and self._heads.get(thread_id, 0) > revision:
            return False
        if changes.get(("session", session_id), 0) > token.seq:
            return False
        return run_id is None or changes.get(("run", run_id), 0) <= token.seq


def _calibration_key(tenant: str, profile: str) -> str:
    # Two keys that ran together here would only make one change end the other's trust: one more read.
    return f"{tenant}\x1f{profile}"
