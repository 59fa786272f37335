"""Rung G's retrieval (F + archive retrieval): what to search for, and which hits count.

Pure. The replay (``infra/laddering.py``) runs the fleet's search with these queries and reads the
chosen hits back as evidence, exactly as a runtime would through ``ctx.search`` and
``PrepareRequest.evidence``; the rung only hands that evidence to the assembler beside F's inputs.

Rules:

1. The current step is what the next model call answers: the records after the newest assistant
   message, plus that message's tool calls (``step_queries``).
2. A query is one identifier of the step — a token with a digit, an underscore, a dot or a slash
   (a file, an item id, an error code) — since a search ANDs its words and a sentence finds nothing.
3. Only archived history is retrieved: records the view no longer shows as history, because the
   committed summary covers them (``archived_hits``); the rest is in the context already.
4. A hit the search marks ``superseded`` is not retrieved: its facts were replaced, and showing it
   would bring a stale value back (§46).
"""

from __future__ import annotations

from contracts import (
    AssistantMessagePayload,
    EventKind,
)

import json
import re
from collections.abc import Sequence

from contracts import SearchHit

from services.core.assemble import ThreadSnapshot
from services.core.records import LedgerRecord

__all__ = ["ARCHIVE_HITS", "STEP_QUERIES", "archived_hits", "step_queries"]

# How many identifiers of the step are searched, and how many archived records are shown at most:
# a few, so the evidence stays a small part of the budget (it is the first material dropped anyway).
STEP_QUERIES = 3
ARCHIVE_HITS = 3
_TOKEN = re.compile(r"[\w./-]{4,}")
_MARK = re.compile(r"[\d_./]")


def step_queries(records: Sequence[LedgerRecord], *, limit: int = STEP_QUERIES) -> tuple[str, ...]:
    """The identifiers of the current step, newest record first, at most ``limit`` (rules 1–2)."""
    ordered = sorted(records, key=lambda r: r.seq)
    last_call = max((i for i, r in enumerate(ordered) if r.kind is EventKind.ASSISTANT_MESSAGE), default=-1)
    step = ordered[last_call + 1 :] if last_call + 1 < len(ordered) else []
    texts = [r.text for r in reversed(step)]
    if last_call >= 0:
        body = ordered[last_call].body
        if isinstance(body, AssistantMessagePayload):
            texts.extend(json.dumps(c.args, sort_keys=True) for c in body.tool_calls)
    out: list[str] = []
    for text in texts:
        for token in _TOKEN.findall(text):
            token = token.strip("./-")
            if len(token) >= 4 and _MARK.search(token) and token not in out:
                out.append(token)
                if len(out) == limit:
                    return tuple(out)
    return tuple(out)


def archived_hits(
    hits: Sequence[SearchHit], snapshot: ThreadSnapshot, *, limit: int = ARCHIVE_HITS
) -> tuple[SearchHit, ...]:
    """The best hits that point at archived, not superseded records, one per record (rules 3–4)."""
    archived = {(r.thread_id, r.event_key) for r in snapshot.records if r.seq <= snapshot.covered_to}
    out: list[SearchHit] = []
    seen: set[tuple[str, int]] = set()
    for hit in sorted(hits, key=lambda h: (-h.rank, -h.seq, h.thread_id, h.start_line)):
        key = (hit.thread_id, hit.seq)
        if hit.superseded or key in seen or (hit.thread_id, hit.event_key) not in archived:
            continue
        seen.add(key)
        out.append(hit)
        if len(out) == limit:
            break
    return tuple(out)
