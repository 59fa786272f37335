"""Forking a session at a seq (``ctx.session.fork``): a new session whose history is the parent's up to
that seq, by reference.

Checks, in order:

1. The parent is a session of the asking tenant, visible to the asking principal; anything else
   looks exactly like a missing session (``thread_not_found``), so ids cannot be probed.
2. The fork id is free — or names this very fork (same parent and seq): a retried request answers
   the fork that exists instead of failing.
3. ``1 <= at_seq <= last_seq`` of the parent (``seq_out_of_range``).
4. ``at_seq`` does not split a tool group: the main thread the newest record at or before it belongs
   to has no call without an outcome at or before ``at_seq`` (``fork_inside_tool_group``). Half a
   group in a branch would be a call whose outcome never comes, or one the fork records a second
   time.

Nothing here writes to the parent: the fork is a new sessions row (pins copied, seq starting at
``at_seq``) and a ``session_forks`` row; its views read the parent's records, never change them.
"""

from __future__ import annotations

from contracts import EventKind

from contracts.branches import ForkRequest, SessionForked

from contracts.exceptions import ForkInsideToolGroup, SeqOutOfRange, SessionExists, ThreadNotFound
from services.store.branches import ForkOrigin, HistoryRow, NewFork
from services.store.ports import BranchConnection, BranchStore

__all__ = ["fork_session", "open_calls", "resolve_origin"]

# Rows read per query while looking for the thread at the fork point.
_PAGE = 512


async def fork_session(store: BranchStore, tenant: str, request: ForkRequest) -> SessionForked:
    """Create (or find again) the fork ``request`` describes."""
    async with store.connection() as s:
        parent = await s.select_fork_parent(tenant, request.session_id)
        if parent is None or (
            parent.principal_id is not None and parent.principal_id != request.principal_id
        ):
            raise ThreadNotFound(f"session {request.session_id}")
        if request.at_seq > parent.last_seq:
            raise SeqOutOfRange(request.session_id, request.at_seq, parent.last_seq)
        source, origin = await resolve_origin(s, request.session_id, request.at_seq)
        existing = await s.select_fork(request.new_session_id)
        if existing is not None:
            if (existing.parent_session_id, existing.at_seq) == (source, request.at_seq):
                return _reply(request.new_session_id, existing, created=False)
            raise SessionExists(request.new_session_id)
        await _check_tool_groups(s, source, origin, request)
        own_reset = await s.last_reset(source, request.at_seq)
        inherited = max(own_reset, origin.inherited_reset if origin else 0)
        fork = NewFork(request.new_session_id, source, request.at_seq, inherited)
        async with s.transaction():
            if not await s.insert_fork(fork):
                raise SessionExists(request.new_session_id)
        return _reply(request.new_session_id, ForkOrigin(source, request.at_seq, inherited), created=True)


async def resolve_origin(s: BranchConnection, session_id: str, at_seq: int) -> tuple[str, ForkOrigin | None]:
    """The session that owns the records up to ``at_seq`` and that session's own fork origin.

    A fork of a fork at or below the parent's branch point is a fork of the grandparent: the
    history is the same, and naming the session that holds it keeps every chain's links strictly
    increasing (each fork's own records lie above its parent's branch point).
    """
    source = session_id
    origin = await s.select_fork(source)
    while origin is not None and at_seq <= origin.at_seq:
        source = origin.parent_session_id
        origin = await s.select_fork(source)
    return source, origin


def open_calls(rows: list[HistoryRow]) -> list[str]:
    """Call ids of ``rows`` (one thread's records, in order) that have no outcome among them."""
    pending: dict[str, None] = {}
    for row in rows:
        match row.kind:
            case EventKind.ASSISTANT_MESSAGE.value:
                for call in _calls(row.payload):
                    pending[call] = None
            case EventKind.TOOL_OUTCOME.value:
                pending.pop(str(row.payload.get("call_id", "")), None)
            case _:
                pass
    return list(pending)


def _calls(payload: dict[str, object]) -> list[str]:
    calls = payload.get("tool_calls")
    if not isinstance(calls, list):
        return []
    return [str(c["call_id"]) for c in calls if isinstance(c, dict) and "call_id" in c]


async def _check_tool_groups(
    s: BranchConnection, source: str, origin: ForkOrigin | None, request: ForkRequest
) -> None:
    session, through = source, request.at_seq
    while True:
        rows = await _all_rows(s, session, after=origin.at_seq if origin else 0, through=through)
        if rows:
            thread = rows[-1].thread_id
            pending = open_calls([r for r in rows if r.thread_id == thread])
            if pending:
                raise ForkInsideToolGroup(request.session_id, request.at_seq, thread, pending)
            return
        if origin is None:
            return
        # No main-thread record of this session at or before the point: the thread is an ancestor's.
        session, through = origin.parent_session_id, origin.at_seq
        origin = await s.select_fork(session)


async def _all_rows(s: BranchConnection, session_id: str, *, after: int, through: int) -> list[HistoryRow]:
    rows: list[HistoryRow] = []
    while True:
        page = await s.select_history(session_id, after=after, through=through, limit=_PAGE)
        rows.extend(page)
        if len(page) < _PAGE:
            return rows
        after = page[-1].seq


def _reply(session_id: str, origin: ForkOrigin, *, created: bool) -> SessionForked:
    return SessionForked(
        session_id=session_id,
        parent_session_id=origin.parent_session_id,
        at_seq=origin.at_seq,
        next_seq=origin.at_seq + 1,
        reset_seq=origin.inherited_reset,
        created=created,
    )
