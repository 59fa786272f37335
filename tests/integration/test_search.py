"""indexer and ctx.search over real servers: scoped, verbatim, catching up, superseded marked, reindexable."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable

import asyncpg
import pytest

from contracts import (
    EvidenceRef,
    PatchOp,
    PathRule,
    PrepareRequest,
    SearchRequest,
    SearchReply,
    StatePatchEvent,
    StatePatchPayload,
    ToolCatalog,
)
from ctxfleet_client.client import FleetClient
from contracts.exceptions import ContentNotFound, IntegrityError, ThreadNotFound
from services.app.indexing import INDEX_VERSION, reindex
from services.store.postgres import PgStore
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

UUID = str(uuid.UUID("3f2b9c1e-8a7d-4c55-9e2a-1b2c3d4e5f60"))


async def _history(client: FleetClient, t: Thread, filler: int) -> str:
    await client.append(t.user("Fix the lint failure", key="task"))
    await client.append(
        t.assistant(calls=(("c0", "bash", {"cmd": "pylint django/db/models/query.py"}),), key="a0")
    )
    await client.append(
        t.outcome(
            "c0",
            f"django/db/models/query.py:1101:4: E1101 Instance has no member (trace {UUID})\n"
            "Traceback (most recent call last):\nValueError: bad queryset",
            status="error",
            key="o0",
        )
    )
    for n in range(filler):
        await client.append(t.assistant(f"step {n}: nothing interesting", key=f"f{n}"))
    return f"f{filler - 1}"


async def _indexed(db: asyncpg.Connection, t: Thread, records: int) -> bool:
    """All ``records`` of the thread are recorded and indexed
    (an index level with a lagging head is not enough)."""
    head = await db.fetchval("SELECT last_seq FROM ctx.thread_heads WHERE thread_id=$1", t.thread_id)
    pos = await db.fetchval("SELECT last_seq FROM ctx.index_positions WHERE thread_id=$1", t.thread_id)
    return head == records and pos == head


async def test_search_finds_an_error_and_a_path_a_thousand_records_back_only_in_its_session(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, other = Thread(), Thread()
    await _history(client, t, 1000)
    await _history(client, other, 3)
    await eventually(lambda: _indexed(db, t, 1003), timeout=60, what="the index to catch up")
    await eventually(lambda: _indexed(db, other, 6), what="the other session's index")
    for query in ("ValueError: bad queryset", "django/db/models/query.py", "E1101", UUID):
        hits = (await client.search(SearchRequest(session_id=t.session_id, query=query))).hits
        assert hits and hits[0].thread_id == t.thread_id and hits[0].event_key in ("o0", "a0"), query
        assert all(h.thread_id == t.thread_id for h in hits)
    outcome = next(
        h
        for h in (await client.search(SearchRequest(session_id=t.session_id, query="E1101"))).hits
        if h.event_key == "o0"
    )
    assert "«E1101»" in outcome.snippet and outcome.start_line == 1
    # Naming the other session's thread as scope never reaches it.
    leaked = await client.search(
        SearchRequest(session_id=t.session_id, query="E1101", thread_id=other.thread_id)
    )
    assert leaked.hits == ()


async def test_search_refuses_another_principal(fleet, client: FleetClient, db: asyncpg.Connection) -> None:
    t = Thread(principal_id="alice")
    await _history(client, t, 1)
    await eventually(lambda: _indexed(db, t, 4), what="the index")
    assert (
        await client.search(SearchRequest(session_id=t.session_id, principal_id="alice", query="E1101"))
    ).hits
    with pytest.raises(ThreadNotFound):
        await client.search(SearchRequest(session_id=t.session_id, principal_id="mallory", query="E1101"))


async def test_a_stopped_indexer_catches_up_without_gaps_or_duplicates(
    start_fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    await start_fleet(workers="recorder,assembler")
    t = Thread()
    last = await _history(client, t, 50)

    async def recorded() -> bool:
        return await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id=$1", t.thread_id) == 53

    await eventually(recorded, what="the records")
    assert await db.fetchval("SELECT count(*) FROM ctx.search_chunks") == 0
    await start_fleet(workers="indexer", recorder_id="indexer-only")
    await eventually(lambda: _indexed(db, t, 53), what="the indexer to catch up")
    per_record = await db.fetch(
        "SELECT seq, count(*) AS n FROM ctx.search_chunks WHERE thread_id=$1 GROUP BY seq ORDER BY seq",
        t.thread_id,
    )
    assert [r["seq"] for r in per_record] == list(range(1, 54)) and all(r["n"] == 1 for r in per_record)
    assert last == "f49"


async def test_superseded_facts_come_back_marked_and_reindex_matches_incremental(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    await client.register_catalog(
        ToolCatalog(release="shop@1", paths=(PathRule(pattern="item:{id}.location", kind="business_fact"),))
    )
    t = Thread()
    await client.append(t.system("shop").model_copy(update={"agent_release": "shop@1"}))

    def move(key: str, where: str) -> StatePatchEvent:
        return StatePatchEvent(
            payload=StatePatchPayload(
                source="orchestrator", ops=(PatchOp(op="set", path="item:42.location", value=where),)
            ),
            event_key=key,
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
        )

    await client.append(move("old", "shelf_A"))
    await client.append(move("new", "shelf_B"))
    await eventually(lambda: _indexed(db, t, 3), what="the index")
    hits = {
        h.event_key: h
        for h in (await client.search(SearchRequest(session_id=t.session_id, query="item:42.location"))).hits
    }
    assert hits["old"].superseded and not hits["new"].superseded
    before = [
        (h.thread_id, h.seq, h.snippet)
        for h in (await client.search(SearchRequest(session_id=t.session_id, query="shelf_A"))).hits
    ]
    pool = fleet.pool
    assert await reindex(PgStore(pool), t.session_id) == 3
    after = [
        (h.thread_id, h.seq, h.snippet)
        for h in (await client.search(SearchRequest(session_id=t.session_id, query="shelf_A"))).hits
    ]
    assert before == after and before


async def test_a_promoted_search_hit_is_quoted_verbatim_with_its_hashes_and_only_in_its_session(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t, other = Thread(), Thread()
    last = await _history(client, t, 2)
    await _history(client, other, 1)
    await eventually(lambda: _indexed(db, t, 5), what="the index")
    await eventually(lambda: _indexed(db, other, 4), what="the other session's index")
    hit = next(
        h
        for h in (await client.search(SearchRequest(session_id=t.session_id, query="ValueError"))).hits
        if h.event_key == "o0"
    )
    ref = EvidenceRef(thread_id=hit.thread_id, seq=hit.seq, start_line=3, end_line=3)
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=20_000,
        after_event_key=last,
        evidence=(ref,),
    )
    prepared = await client.prepare(request)
    block = next(b for b in prepared.blocks if b.block_id == "evidence:0")
    quoted = prepared.messages[block.first_message].content
    row = await db.fetchrow(
        "SELECT content_sha256, record_hash FROM ctx.records WHERE thread_id=$1 AND seq=$2",
        hit.thread_id,
        hit.seq,
    )
    assert quoted.endswith("ValueError: bad queryset")
    assert "Traceback" not in quoted  # only the requested line
    assert row["content_sha256"][:16] in quoted and row["record_hash"][:16] in quoted
    plain = await client.prepare(request.model_copy(update={"evidence": ()}))
    assert plain.prepared_id != prepared.prepared_id
    assert not any(b.block_id.startswith("evidence:") for b in plain.blocks)
    # The same record named from the other session is indistinguishable from a missing one.
    stolen = PrepareRequest(
        session_id=other.session_id,
        run_id=other.run_id,
        instance_id=other.instance_id,
        budget_tokens=20_000,
        evidence=(ref,),
    )
    with pytest.raises(ContentNotFound):
        await client.prepare(stolen)


async def test_search_narrows_to_kinds_and_a_time_range_and_rejects_a_backwards_range(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await _history(client, t, 1)
    await eventually(lambda: _indexed(db, t, 4), what="the index")
    both = (
        await client.search(SearchRequest(session_id=t.session_id, query="django/db/models/query.py"))
    ).hits
    assert {h.event_key for h in both} == {"a0", "o0"}
    outcome = next(h for h in both if h.event_key == "o0")
    only = (
        await client.search(
            SearchRequest(session_id=t.session_id, query="django/db/models/query.py", kinds=(outcome.kind,))
        )
    ).hits
    assert [h.event_key for h in only] == ["o0"]
    stamps = sorted(h.recorded_at for h in both)
    later = (
        await client.search(
            SearchRequest(session_id=t.session_id, query="django/db/models/query.py", since=stamps[-1])
        )
    ).hits
    assert stamps[-1] in {h.recorded_at for h in later} and all(h.recorded_at >= stamps[-1] for h in later)
    assert (
        await client.search(SearchRequest(session_id=t.session_id, query="django", until=stamps[0]))
    ).hits == ()
    with pytest.raises(ValueError, match="until must be after since"):
        SearchRequest(session_id=t.session_id, query="x", since=stamps[-1], until=stamps[0])


async def test_an_index_from_an_older_index_version_is_rebuilt_by_the_sweep(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await _history(client, t, 1)
    await eventually(lambda: _indexed(db, t, 4), what="the index")
    # One transaction, so the sweep sees the old version and its leftover chunk together.
    async with db.transaction():
        await db.execute(
            "UPDATE ctx.index_positions SET index_version = $2 WHERE thread_id = $1",
            t.thread_id,
            INDEX_VERSION - 1,
        )
        await db.execute(
            """INSERT INTO ctx.search_chunks (thread_id, seq, chunk, session_id, kind, event_key,
                                              start_byte, end_byte, start_line, end_line, recorded_at,
                                              text, tsv)
               VALUES ($1, 2, 7, $2, 'assistant_message', 'a0', 0, 5, 1, 1, now(), 'stale',
                       to_tsvector('simple', 'stale'))""",
            t.thread_id,
            t.session_id,
        )

    async def migrated() -> bool:
        version = await db.fetchval(
            "SELECT index_version FROM ctx.index_positions WHERE thread_id=$1", t.thread_id
        )
        return version == INDEX_VERSION and await _indexed(db, t, 4)

    await eventually(migrated, timeout=15, what="the sweep to reindex the old version")
    chunks = await db.fetch(
        "SELECT seq, chunk FROM ctx.search_chunks WHERE thread_id=$1 ORDER BY seq, chunk", t.thread_id
    )
    assert [(r["seq"], r["chunk"]) for r in chunks] == [(1, 0), (2, 0), (3, 0), (4, 0)]
    assert (await client.search(SearchRequest(session_id=t.session_id, query="stale"))).hits == ()


async def test_evidence_from_a_tampered_blob_is_an_integrity_error_not_content(
    fleet, client: FleetClient, db: asyncpg.Connection
) -> None:
    t = Thread()
    await client.append(t.user("show the log", key="task"))
    await client.append(t.assistant(calls=(("c0", "bash", {"cmd": "cat build.log"}),), key="a0"))
    await client.append(t.outcome("c0", "".join(f"build line {n}: ok\n" for n in range(2000)), key="o0"))
    await eventually(lambda: _indexed(db, t, 3), what="the index")
    row = await db.fetchrow(
        "SELECT seq, blob_sha256 FROM ctx.records WHERE thread_id=$1 AND event_key='o0'", t.thread_id
    )
    assert row["blob_sha256"] is not None  # the output was externalized
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=20_000,
        after_event_key="o0",
        evidence=(EvidenceRef(thread_id=t.thread_id, seq=row["seq"], start_line=7, end_line=7),),
    )
    prepared = await client.prepare(request)
    block = next(b for b in prepared.blocks if b.block_id == "evidence:0")
    assert prepared.messages[block.first_message].content.endswith("build line 6: ok\n")
    await db.execute(
        "UPDATE ctx.blobs SET content = convert_to('build line 6: ok', 'UTF8') WHERE sha256 = $1",
        row["blob_sha256"],
    )
    with pytest.raises(IntegrityError):
        await client.prepare(request)


async def test_indexer_indexes_an_8_mib_input_and_a_200_000_key_call_once_cut_with_the_rest_of_the_thread(
    fleet, client: FleetClient, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    # Each alone is over PostgreSQL's 1 MB tsvector limit: it was retried every pass, for ever.
    t = Thread()
    huge = " ".join(f"w{n:07d}" for n in range(900_000))  # one line of 8.1 MB, distinct words
    args = {f"k{n:07d}": n for n in range(200_000)}
    with caplog.at_level(logging.INFO, logger="ctxfleet.indexer"):
        await client.append(t.user("before the paste: quarterly numbers", key="u1"))
        await client.append(t.user(huge, key="u2"))
        await client.append(t.assistant("filling the form", calls=(("c1", "fill", args),), key="a3"))
        await client.append(t.user("after the paste: quarterly numbers", key="u4"))
        await eventually(lambda: _indexed(db, t, 4), timeout=60, what="the thread to be indexed")

    def search(query: str) -> Awaitable[SearchReply]:
        return client.search(SearchRequest(session_id=t.session_id, query=query))

    assert sorted(h.event_key for h in (await search("quarterly numbers")).hits) == ["u1", "u4"]
    assert [h.event_key for h in (await search("w0000007")).hits] == ["u2"]  # the input's first MiB
    assert [h.event_key for h in (await search("w0500000")).hits] == []  # past it: readable only
    assert [h.event_key for h in (await search("k0000005")).hits] == ["a3"]
    # Indexed once, each cut counted, nothing retried or warned about.
    registry = fleet.metrics.registry
    assert registry.get_sample_value("ctx_index_records_cut_total") == 2
    assert registry.get_sample_value("ctx_indexed_records_total") == 4
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert len([r for r in caplog.records if "indexed up to their first" in r.getMessage()]) <= 2
