"""The search index's contract on both stores: index positions, visibility, matching and superseded hits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contracts import SearchRequest
from contracts.subjects import DEFAULT_TENANT
from services.app.indexing import (
    INDEX_VERSION,
    MAX_INDEXED_BYTES,
    IndexPass,
    index_thread,
    reindex,
    stale_threads,
)
from services.store.search import IndexStep
from tests.contract.test_store_contract import _write
from tests.fixtures.builders import Thread

pytestmark = pytest.mark.anyio


async def _search(store: Any, t: Thread, query: str, **fields: Any) -> list[tuple[int, str, bool]]:
    hits = await store.search(DEFAULT_TENANT, SearchRequest(session_id=t.session_id, query=query, **fields))
    return [(h.seq, h.event_key, h.superseded) for h in hits]


async def test_search_finds_every_word_of_the_query_in_the_session_and_nothing_before_indexing(
    store: Any,
) -> None:
    t = Thread()
    await _write(
        store,
        [
            t.user("Fix the parser in tokenizer module", key="u1"),
            t.assistant("reading", calls=(("c1", "bash", {"cmd": "cat tokenizer.py"}),), key="a1"),
            t.outcome("c1", "def tokenize(text): raise ValueError('bad parser state')", key="o1"),
        ],
    )
    assert await _search(store, t, "parser") == []  # not indexed yet
    assert await stale_threads(store) == [t.thread_id]

    assert await index_thread(store, t.thread_id) == IndexPass(3)
    assert await index_thread(store, t.thread_id) == IndexPass(0)  # the position moved: never twice
    assert await stale_threads(store) == []
    # Both records hold "parser"; only the outcome holds both words; the call's arguments are searchable.
    assert sorted(await _search(store, t, "parser")) == [(1, "u1", False), (3, "o1", False)]
    assert await _search(store, t, "parser ValueError") == [(3, "o1", False)]
    # A file name is one word (PostgreSQL's parser keeps it whole): it is not the word "tokenizer".
    assert await _search(store, t, "tokenizer.py", kinds=("assistant_message",)) == [(2, "a1", False)]
    assert await _search(store, t, "tokenizer") == [(1, "u1", False)]
    assert await _search(store, t, "nowhere") == []
    other = await store.search("another-tenant", SearchRequest(session_id=t.session_id, query="parser"))
    assert other is None

    assert await reindex(store, t.session_id) == 3
    assert len(await _search(store, t, "parser")) == 2


class _CountedIndex:
    """The store, with the size of each ``index_next`` step it was asked for recorded."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.steps: list[int] = []

    async def index_next(self, thread_id: str, **options: Any) -> IndexStep:
        step: IndexStep = await self._store.index_next(thread_id, **options)
        self.steps.append(step.records)
        return step


async def test_a_pass_indexes_the_whole_thread_and_stops_at_its_end_without_asking_again(store: Any) -> None:
    t = Thread()
    await _write(store, [t.user(f"question {n} about the parser", key=f"u{n}") for n in range(5)])
    counted = _CountedIndex(store)
    assert (await index_thread(counted, t.thread_id, batch=2)).records == 5  # type: ignore[arg-type]
    assert counted.steps == [2, 2, 1]  # the short step was the end: no fourth, empty one

    await _write(store, [t.user("one more", key="u5")], start_seq=6)
    counted.steps.clear()
    assert (await index_thread(counted, t.thread_id, batch=2)).records == 1  # type: ignore[arg-type]
    assert counted.steps == [1]
    assert len(await _search(store, t, "parser")) == 5


async def test_two_passes_over_the_same_records_at_once_store_each_chunk_once(store: Any) -> None:
    t = Thread()
    await _write(store, [t.user(f"question {n} about the parser", key=f"u{n}") for n in range(4)])
    done = [
        p.records
        for p in await asyncio.gather(index_thread(store, t.thread_id), index_thread(store, t.thread_id))
    ]
    assert 4 in done and sum(done) in (4, 8)  # the second saw the first's position, or the same records
    assert await stale_threads(store) == []
    assert sorted(await _search(store, t, "parser")) == [(n + 1, f"u{n}", False) for n in range(4)]
    assert await index_thread(store, t.thread_id) == IndexPass(0)


def _distinct_words(first: int, count: int) -> str:
    # Words of 8 bytes, each its own lexeme: 12 bytes each in a tsvector (its bytes, 2, one position).
    return " ".join(f"w{n:07d}" for n in range(first, first + count))


def _one_chunk(kind: str, text: str, payload: str) -> list[tuple[int, int, int, int, str]]:
    """A chunker that keeps a record whole, however long: what made one chunk too long for a tsvector."""
    return [(0, len(text.encode()), 1, 1, text)]


async def test_index_next_skips_once_the_record_too_long_for_a_tsvector_and_indexes_the_others(
    store: Any,
) -> None:
    t = Thread()
    # 200,000 distinct words: 2.4 MB of tsvector, over PostgreSQL's 1 MB.
    await _write(
        store,
        [
            t.user("before the huge one: parser", key="u1"),
            t.user(_distinct_words(0, 200_000), key="u2"),
            t.user("after the huge one: parser", key="u3"),
        ],
    )
    step = await store.index_next(t.thread_id, batch=500, version=INDEX_VERSION, chunker=_one_chunk)
    assert step.records == 3
    assert [(s.seq, s.sqlstate) for s in step.skipped] == [(2, "54000")]
    assert "string is too long for tsvector" in step.skipped[0].reason
    assert sorted(await _search(store, t, "parser")) == [(1, "u1", False), (3, "u3", False)]
    # The position moved past it: no later step (nor a restart's sweep) meets it again.
    assert await stale_threads(store) == []
    assert await store.index_next(t.thread_id, batch=500, version=INDEX_VERSION, chunker=_one_chunk) == (
        IndexStep(0)
    )


async def test_index_thread_indexes_a_record_longer_than_the_bound_up_to_it_and_the_rest_of_the_thread(
    store: Any,
) -> None:
    t = Thread()
    # One line of 1.35 MB: its first MiB (words up to ~116,000) is indexed, in chunks of 4 KiB.
    huge = _distinct_words(0, 150_000)
    assert len(huge.encode()) > MAX_INDEXED_BYTES
    await _write(
        store,
        [
            t.user("before the huge paste", key="u1"),
            t.user(huge, key="u2"),
            t.user("after the paste", key="u3"),
        ],
    )
    assert await index_thread(store, t.thread_id) == IndexPass(3, cut=1)
    assert await _search(store, t, "w0000007") == [(2, "u2", False)]
    assert await _search(store, t, "w0100000") == [(2, "u2", False)]
    assert await _search(store, t, "w0140000") == []  # past the first MiB: readable, not searchable
    assert sorted(await _search(store, t, "paste")) == [(1, "u1", False), (3, "u3", False)]
    assert await stale_threads(store) == []
    assert await index_thread(store, t.thread_id) == IndexPass(0)
