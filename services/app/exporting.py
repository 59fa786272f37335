"""Exporting a session as a trace (``ctx.session.export``): the JSONL ``ctxfleet replay`` reads
(docs/trace-format.md), page by page.

What a page holds, and why:

1. The session's history in seq order: its main threads' records and, for a fork, its ancestors'
   up to each branch point — what a new run of the session would inherit. Child threads have no
   form in the trace format (their results reach the parent as records of their own kind).
2. One line per record of the four trace kinds; ``run_status`` lines are left out, because the
   trace's ``run`` field carries where a run ends and ``replay`` closes it the same way.
3. Anything a replay could not give back as it was recorded — another kind, a supplement, a
   completion check, an operation id, an external ref — refuses the export (``not_exportable``,
   naming the record) rather than writing a trace that replays into something else.
4. At most ``max_bytes`` of reply per page, JSON escaping counted; a longer line is split across
   pages (the cursor is the seq before it and the characters already sent), so no record is too
   big for a NATS reply.
"""

from __future__ import annotations

from contracts import EventKind

import json
from typing import assert_never

from contracts.branches import ExportPage, ExportRequest

from contracts.exceptions import NotExportable, ThreadNotFound
from services.store.branches import HistoryRow
from services.store.ports import BranchConnection, BranchStore

__all__ = ["export_page", "history_segments", "trace_line"]

_ROWS = 64
# Room kept for the reply's envelope (field names, session id, cursor).
_ENVELOPE = 512
# Below this much room a page ends instead of starting a line it would have to cut.
_MIN_PIECE = 256
# The most a character can cost once JSON-escaped (``\u001f``), so a cut by characters fits.
_MAX_CHAR_COST = 6


async def export_page(store: BranchStore, tenant: str, session_id: str, request: ExportRequest) -> ExportPage:
    """The page of the export of ``session_id`` (of ``tenant``) that ``request`` asks for."""
    async with store.connection() as s:
        session = await s.select_fork_parent(tenant, session_id)
        if session is None:
            raise ThreadNotFound(f"session {session_id}")
        segments = await history_segments(s, session_id, session.last_seq)
        return await _page(s, session_id, segments, request)


async def history_segments(s: BranchConnection, session_id: str, last_seq: int) -> list[tuple[str, int, int]]:
    """``(session, after, through)`` ranges of own records that make up the history, oldest first."""
    segments: list[tuple[str, int, int]] = []
    current, through = session_id, last_seq
    origin = await s.select_fork(current)
    while True:
        segments.append((current, origin.at_seq if origin else 0, through))
        if origin is None:
            return segments[::-1]
        current, through = origin.parent_session_id, origin.at_seq
        origin = await s.select_fork(current)


def trace_line(session_id: str, row: HistoryRow) -> str | None:
    """The trace line of ``row`` (JSON, no newline); ``None`` for a record the trace leaves implied."""
    p = row.payload
    line: dict[str, object] = {"kind": row.kind, "run": row.run_id}
    if row.client_ts is not None:
        line["ts"] = row.client_ts
    line["text"] = row.text
    try:
        kind = EventKind(row.kind)
    except ValueError:
        raise NotExportable(session_id, row.seq, f"a {row.kind} record") from None
    match kind:
        case EventKind.SYSTEM:
            pass
        case EventKind.USER_INPUT:
            if p.get("intent", "question") != "question":
                raise NotExportable(session_id, row.seq, f"a user_input with intent {p.get('intent')}")
        case EventKind.ASSISTANT_MESSAGE:
            if p.get("purpose", "action") != "action":
                raise NotExportable(
                    session_id, row.seq, f"an assistant_message of purpose {p.get('purpose')}"
                )
            calls = p.get("tool_calls") or []
            assert isinstance(calls, list)
            if any(isinstance(c, dict) and c.get("operation_id") for c in calls):
                raise NotExportable(session_id, row.seq, "a tool call with an operation_id")
            line["tool_calls"] = [
                {"call_id": c["call_id"], "name": c["name"], "args": c.get("args", {})}
                for c in calls
                if isinstance(c, dict)
            ]
            if p.get("usage") is not None:
                line["usage"] = p["usage"]
        case EventKind.TOOL_OUTCOME:
            if p.get("external_ref"):
                raise NotExportable(session_id, row.seq, "a tool_outcome with an external_ref")
            line["call_id"] = p.get("call_id")
            line["status"] = p.get("status", "success")
        case EventKind.RUN_STATUS:
            return None
        case (
            EventKind.RESOURCE_ACTIVATED
            | EventKind.CHILD_RESULT
            | EventKind.CONTEXT_EXPORT
            | EventKind.CONTEXT_RESET
            | EventKind.STATE_PATCH
            | EventKind.OPERATION_RECONCILE
            | EventKind.PHASE_CHANGE
        ):
            raise NotExportable(session_id, row.seq, f"a {row.kind} record")
        case _:
            assert_never(kind)
    return json.dumps(line, ensure_ascii=False, separators=(",", ":"))


def _cost(piece: str) -> int:
    """Bytes ``piece`` takes inside the JSON reply (without its quotes)."""
    return len(json.dumps(piece, ensure_ascii=False).encode()) - 2


async def _page(
    s: BranchConnection, session_id: str, segments: list[tuple[str, int, int]], request: ExportRequest
) -> ExportPage:
    budget = request.max_bytes - _ENVELOPE
    parts: list[str] = []
    used = 0
    after, offset = request.after_seq, request.offset

    def page(next_after: int | None, next_offset: int = 0) -> ExportPage:
        return ExportPage(
            session_id=session_id, chunk="".join(parts), next_after_seq=next_after, next_offset=next_offset
        )

    for source, low, through in segments:
        cursor = max(after, low)
        while cursor < through:
            rows = await s.select_history(source, after=cursor, through=through, limit=_ROWS)
            for row in rows:
                cursor = row.seq
                line = trace_line(session_id, row)
                if line is None:
                    after = row.seq  # the cut, if any, is in the next line that has one
                    continue
                piece = line[offset:] + "\n"
                cost = _cost(piece)
                if used + cost <= budget:
                    parts.append(piece)
                    used += cost
                    after, offset = row.seq, 0
                    continue
                room = budget - used
                if parts and room < _MIN_PIECE:
                    return page(after, offset)
                n = max(1, room // _MAX_CHAR_COST)
                parts.append(piece[:n])
                return page(after, offset + n)
            if len(rows) < _ROWS:
                break
    return page(None)
