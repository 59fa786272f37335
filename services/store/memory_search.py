"""The in-memory store's search index: chunks per record, index positions, and the ranked query.

The twin of ``services/store/search.py`` for tests and the in-process ablation ladder (rung G). It
keeps what PostgreSQL keeps — chunks keyed by ``(thread, seq, chunk)``, one position per thread, the
index version — and answers the same ``SearchRequest`` with the same visibility (only the asking
principal's session) and order (rank, then newest). Matching approximates the ``simple`` text
configuration: a file path or dotted name (``src/app.py``, ``tokenizer.py``) is one word, as
PostgreSQL's parser keeps it, and otherwise lowercase runs of letters and digits are the words
(``item_07`` is ``item`` and ``07``); a chunk matches when it holds every word of the query
(``plainto_tsquery`` ANDs them). The rank counts the query's words in the chunk over its length, as
``ts_rank`` does without normalization; it is not ``ts_rank``'s number. The parser's rarer token
types (URLs, e-mail addresses, versions) are not imitated. A chunk whose words would make a tsvector
over PostgreSQL's limit is refused as PostgreSQL refuses it (its record skipped, SQLSTATE 54000),
its size counted as PostgreSQL counts it: per distinct word, its bytes (even), 2 and 2 per position.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from contracts import SearchHit, SearchRequest

from services.store.search import TSVECTOR_MAX_BYTES, Chunker, IndexStep, SkippedRecord, chunk_rows

__all__ = ["MemoryIndex", "words_of"]

# A path or dotted name first (kept whole), else a run of letters and digits.
_WORD = re.compile(r"[\w-]+(?:[./][\w-]+)+|[^\W_]+", re.UNICODE)
# As ``search.py``: rank only the newest candidates of a common word in a huge session.
_CANDIDATES = 2000
# ts_headline's MaxWords: the snippet is the words around the first match.
_SNIPPET_WORDS = 24
# Positions a tsvector keeps per lexeme at most.
_MAX_POSITIONS = 256


def _tsvector_bytes(words: Counter[str]) -> int:
    return sum(
        len(w.encode("utf-8")) + len(w.encode("utf-8")) % 2 + 2 + 2 * min(n, _MAX_POSITIONS)
        for w, n in words.items()
    )


def words_of(text: str) -> list[str]:
    """The words of ``text`` as the twin indexes and queries them (lowercase)."""
    return [w.lower() for w in _WORD.findall(text)]


@dataclass(frozen=True, slots=True)
class _Chunk:
    thread_id: str
    seq: int
    chunk: int
    session_id: str
    kind: str
    event_key: str
    start_byte: int
    end_byte: int
    start_line: int
    end_line: int
    recorded_at: datetime
    text: str
    words: Counter[str]


@dataclass
class MemoryIndex:
    """The search tables of a ``MemoryStore``: chunks and per-thread positions ``(last_seq, version)``."""

    chunks: dict[tuple[str, int, int], _Chunk] = field(default_factory=dict)
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)

    def index_next(
        self,
        thread_id: str,
        rows: Sequence[Mapping[str, Any]],
        blobs: Mapping[str, bytes],
        *,
        batch: int,
        version: int,
        chunker: Chunker,
    ) -> IndexStep:
        """Index up to ``batch`` of the thread's ``rows`` (its records, any order) after its position."""
        last, indexed_version = self.positions.get(thread_id, (0, version))
        if indexed_version != version:
            # Indexed under another chunking: migrate by reindexing, as ``search.index_next`` does.
            self.drop_threads([thread_id])
            last = 0
        todo = sorted((r for r in rows if r["seq"] > last), key=lambda r: r["seq"])[:batch]
        if not todo:
            return IndexStep(0)
        skipped: list[SkippedRecord] = []
        for r in todo:
            text = r["text"] if r["text"] is not None else blobs[r["blob_sha256"]].decode("utf-8", "replace")
            chunks = [
                _Chunk(*values, Counter(words_of(values[-1])))
                for values in chunk_rows(thread_id, r, text or "", chunker)
            ]
            too_long = max((_tsvector_bytes(c.words) for c in chunks), default=0)
            if too_long > TSVECTOR_MAX_BYTES:
                reason = f"string is too long for tsvector ({too_long} bytes, max {TSVECTOR_MAX_BYTES} bytes)"
                skipped.append(SkippedRecord(r["seq"], "54000", reason))
                continue
            for c in chunks:
                self.chunks.setdefault((c.thread_id, c.seq, c.chunk), c)
        self.positions[thread_id] = (max(last, todo[-1]["seq"]), version)
        return IndexStep(len(todo), tuple(skipped))

    def stale_threads(self, heads: Mapping[str, int], limit: int, version: int) -> list[str]:
        """Threads recorded past their position, or indexed under another version (``heads``: last seqs)."""
        stale = [
            t
            for t, last_seq in heads.items()
            if last_seq > self.positions.get(t, (0, version))[0]
            or self.positions.get(t, (0, -1))[1] != version
        ]
        return stale[:limit]

    def drop_threads(self, threads: Sequence[str]) -> None:
        gone = set(threads)
        for key in [k for k in self.chunks if k[0] in gone]:
            del self.chunks[key]
        for t in gone:
            self.positions.pop(t, None)

    def search(
        self,
        request: SearchRequest,
        *,
        run_of: Mapping[str, str],
        superseded: frozenset[tuple[str, int]],
    ) -> tuple[SearchHit, ...]:
        """The best hits of ``request`` among its session's chunks (``run_of``: thread → run)."""
        query = set(words_of(request.query))
        if not query:
            return ()
        matches = [
            c
            for c in self.chunks.values()
            if c.session_id == request.session_id
            and query <= c.words.keys()
            and (request.run_id is None or run_of.get(c.thread_id) == request.run_id)
            and (request.thread_id is None or c.thread_id == request.thread_id)
            and (not request.kinds or c.kind in request.kinds)
            and (request.since is None or c.recorded_at >= request.since)
            and (request.until is None or c.recorded_at < request.until)
        ]
        matches.sort(key=lambda c: (c.recorded_at, c.seq), reverse=True)
        ranked = sorted(
            ((_rank(c, query), c) for c in matches[:_CANDIDATES]),
            key=lambda rc: (-rc[0], -rc[1].seq, rc[1].thread_id, rc[1].chunk),
        )
        return tuple(
            SearchHit(
                thread_id=c.thread_id,
                seq=c.seq,
                kind=c.kind,
                event_key=c.event_key,
                recorded_at=c.recorded_at,
                snippet=_snippet(c.text, query),
                start_byte=c.start_byte,
                end_byte=c.end_byte,
                start_line=c.start_line,
                end_line=c.end_line,
                rank=rank,
                superseded=(c.thread_id, c.seq) in superseded,
            )
            for rank, c in ranked[: request.limit]
        )


def _rank(chunk: _Chunk, query: set[str]) -> float:
    total = sum(chunk.words.values()) or 1
    return sum(chunk.words[w] for w in query) / total


def _snippet(text: str, query: set[str]) -> str:
    """The words around the first match, matches marked as ``ts_headline`` marks them (« »)."""
    words = text.split()
    first = next((i for i, w in enumerate(words) if set(words_of(w)) & query), 0)
    start = max(0, first - _SNIPPET_WORDS // 3)
    shown = words[start : start + _SNIPPET_WORDS]
    return " ".join(f"«{w}»" if set(words_of(w)) & query else w for w in shown)
