"""Export and fork through NATS and PostgreSQL: a session exported and replayed is the same
session again; a fork branches by reference and leaves its parent byte-identical."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import nats
import pytest

from contracts import (
    CompactionPolicy,
    CompactionTriggers,
    ContextPolicy,
    PreparedContext,
    PrepareRequest,
)
from contracts.branches import ExportRequest, ForkRequest
from infra import SAMPLES_DIR
from services.core.trace import _parse, read_trace
from ctxfleet_client.client import FleetClient
from services.edge.replay import ReplayOptions, replay_trace
from contracts.exceptions import ForkInsideToolGroup, SeqOutOfRange, SessionExists, ThreadNotFound
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually
from tests.integration.test_nats_accounts import SecuredNats, secured_nats  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

SAMPLE = SAMPLES_DIR / "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl"
# A step long enough that a summary of a few of them is a real reduction.
LONG = "{} " + "the step inspected the order records and compared totals " * 12
_RECORDS = """
SELECT r.kind, r.event_key, r.payload::text AS payload,
       COALESCE(r.text, convert_from(b.content, 'UTF8')) AS text, r.view_text,
       r.tokens_o200k, r.tokens_cl100k, r.client_ts, r.run_id
FROM ctx.records r LEFT JOIN ctx.blobs b ON b.sha256 = r.blob_sha256
WHERE r.session_id = $1 ORDER BY r.session_seq
"""


async def _export(client: FleetClient, session_id: str) -> str:
    return "".join([chunk async for chunk in client.export_session(session_id)])


async def _records(db: asyncpg.Connection, session_id: str) -> list[dict[str, Any]]:
    rows = [dict(r) for r in await db.fetch(_RECORDS, session_id)]
    for row in rows:  # run ids (and run ends' keys) are the session's own: replay names them after it
        row["run_id"] = row["run_id"].replace(session_id, "<session>")
        row["event_key"] = row["event_key"].replace(session_id, "<session>")
    return rows


def _contexts(folder: Path, session_id: str) -> list[dict[str, Any]]:
    # A later run shows the first run's call ids tagged with that thread (``c1@<sha1[:6]>``): an id,
    # whose tokens vary with its hex digits, so where it appears the token figures are left out.
    tag = "@" + hashlib.sha1(f"{session_id}-r1.main".encode()).hexdigest()[:6]
    out = []
    for path in sorted(folder.glob("*.json")):
        text = path.read_text(encoding="utf-8")
        context = json.loads(text.replace(session_id, "<session>").replace(tag, "@<tag>"))
        if tag in text:
            # Likewise what is measured from those tokens (the water level) or hashed from the ids.
            context.pop("budget_report")
            context.pop("window_report", None)
            for block in context["blocks"]:
                block.pop("tokens")
            for protected in context.get("protected_block_manifest", []):
                protected.pop("sha256")
        # Derived from the ids, and the head's revision: how many recorder batches wrote the thread,
        # which depends on timing, not on what was recorded.
        context.pop("prepared_id")
        context["source_watermark"].pop("head_revision")
        out.append(context)
    return out


async def _replay(
    client: FleetClient, trace: Path, session_id: str, dump: Path, policy: str, records: int
) -> None:
    options = ReplayOptions(
        session_id=session_id, model_profile=None, budget_tokens=150_000, dump_dir=dump, policy=policy
    )
    report = await replay_trace(client, read_trace(trace), options)
    assert report.totals["errors"] == 0

    async def recorded() -> bool:  # the replay's last event is published, not yet known recorded
        return (await client.inspect_session(session_id)).last_seq >= records

    await eventually(recorded, what=f"{records} records of {session_id}")


async def test_a_replayed_sample_exported_and_replayed_again_records_and_prepares_the_same(
    fleet, client: FleetClient, db: asyncpg.Connection, tmp_path: Path
) -> None:
    # Budget far above the trace: no compaction lands mid-replay, so both replays prepare alike.
    policy = ContextPolicy(name=f"roomy-{uuid.uuid4().hex[:6]}", model_profile=None, budget_tokens=200_000)
    await client.register_policy(policy)
    # Two runs, so the export carries where one run ends and the next begins.
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    two_runs = tmp_path / "two-runs.jsonl"
    two_runs.write_text(
        "\n".join(
            [
                *lines,
                json.dumps({"kind": "user_input", "text": "And now the docs.", "run": "second"}),
                json.dumps({"kind": "assistant_message", "text": "Docs updated.", "run": "second"}),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    a, b = f"rt-a-{uuid.uuid4().hex[:8]}", f"rt-b-{uuid.uuid4().hex[:8]}"
    await _replay(client, two_runs, a, tmp_path / "a", policy.name, len(lines) + 3)
    exported = tmp_path / "export.jsonl"
    exported.write_text(await _export(client, a), encoding="utf-8")
    assert len(read_trace(exported)) == len(lines) + 2
    await _replay(client, exported, b, tmp_path / "b", policy.name, len(lines) + 3)

    records_a, records_b = await _records(db, a), await _records(db, b)
    assert len(records_a) == len(lines) + 3  # and the end of the first run
    assert records_a == records_b
    contexts_a, contexts_b = _contexts(tmp_path / "a", a), _contexts(tmp_path / "b", b)
    assert len(contexts_a) > 5 and contexts_a == contexts_b
    # Exporting the replay of the export gives the export back, run names aside.
    assert (await _export(client, b)).replace(b, a) == exported.read_text(encoding="utf-8")


async def test_an_export_in_pages_of_the_smallest_size_is_the_same_trace(
    fleet, client: FleetClient, tmp_path: Path
) -> None:
    session = f"pages-{uuid.uuid4().hex[:8]}"
    await _replay(client, SAMPLE, session, tmp_path / "d", "default", len(read_trace(SAMPLE)))
    whole = await _export(client, session)
    chunks, request = [], ExportRequest(max_bytes=4096)
    while True:
        page = await client.export_page(session, request)
        chunks.append(page.chunk)
        if page.next_after_seq is None:
            break
        request = ExportRequest(after_seq=page.next_after_seq, offset=page.next_offset, max_bytes=4096)
    assert len(chunks) > 10 and "".join(chunks) == whole
    assert len(list(_parse("x", iter(whole.splitlines(True))))) == len(read_trace(SAMPLE))


def _request(t: Thread, after: str) -> PrepareRequest:
    return PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=100_000,
        after_event_key=after,
    )


async def _summaries(db: asyncpg.Connection, thread_id: str) -> int:
    return int(await db.fetchval("SELECT count(*) FROM ctx.summaries WHERE thread_id = $1", thread_id))


@pytest.mark.parametrize("compacts_before_its_question", [False, True])
async def test_a_fork_that_records_and_compacts_leaves_its_parents_context_and_inspection_byte_identical(
    fleet, client: FleetClient, db: asyncpg.Connection, compacts_before_its_question: bool
) -> None:
    policy = ContextPolicy(
        name=f"steps3-{uuid.uuid4().hex[:6]}",
        model_profile=None,
        budget_tokens=100_000,
        compaction=CompactionPolicy(
            triggers=CompactionTriggers(context_ratio=None, model_steps=3), keep_recent_groups=0
        ),
    )
    await client.register_policy(policy)
    a = Thread()
    await client.append(
        a.system("You are the support agent.", key="sys").model_copy(update={"policy": policy.name})
    )
    await client.append(a.user("Where is order 42?", key="q"))
    await client.append(a.assistant(LONG.format("a1"), calls=(("c1", "lookup", {"order": 42}),), key="a1"))
    await client.append(a.outcome("c1", "shipped on Monday", key="o1"))  # seq 4: the fork point
    await client.append(a.assistant(LONG.format("a2"), calls=(("c2", "track", {"order": 42}),), key="a2"))
    await client.append(a.outcome("c2", "in transit", key="o2"))
    await client.append(a.assistant(LONG.format("a3"), key="a3"))  # third step: the parent compacts
    await eventually(lambda: _settled(db, a.thread_id), what="the parent's compaction")
    parent_before = (await client.prepare(_request(a, "a3"))).model_dump_json()
    inspection_before = (await client.inspect(a.thread_id, limit=100)).model_dump_json()
    session_before = (await client.inspect_session(a.session_id)).model_dump_json()
    export_before = await _export(client, a.session_id)
    views_before = await db.fetch(_VIEW, a.thread_id)

    forked = await client.fork_session(
        ForkRequest(session_id=a.session_id, at_seq=4, new_session_id=f"{a.session_id}-f")
    )
    assert (forked.parent_session_id, forked.next_seq, forked.created) == (a.session_id, 5, True)
    f = Thread(session_id=forked.session_id)
    await client.append(f.assistant(LONG.format("f1"), calls=(("d1", "refund", {"order": 42}),), key="f1"))
    await client.append(f.outcome("d1", "refund queued", key="g1"))
    await client.append(f.assistant(LONG.format("f2"), calls=(("d2", "notify", {"order": 42}),), key="f2"))
    await client.append(f.outcome("d2", "mail sent", key="g2"))
    await client.append(f.assistant(LONG.format("f3"), calls=(("d3", "close", {"order": 42}),), key="f3"))
    await client.append(f.outcome("d3", "closed", key="g3"))

    async def compacted_itself() -> bool:
        # The parent's summary counted its steps past the fork point: the fork compacts on its own.
        return await _summaries(db, f.thread_id) >= 1 and await _settled(db, f.thread_id)

    if compacts_before_its_question:
        # The parent's question is then the current request, left out of the summary: once the
        # fork's own question takes its place, it must be shown from its record.
        await eventually(compacted_itself, what="the fork's own compaction")
    await client.append(f.user("Then refund it.", key="fq"))
    await eventually(compacted_itself, what="the fork's own compaction")
    prepared = await client.prepare(_request(f, "fq"))
    texts = "\n".join(m.content or "" for m in prepared.messages)
    # The parent's question (seq 2) and its tool group up to the fork point, then the fork's own steps;
    # never the parent's steps after it. How far the fork's own summary reaches depends on when its
    # compaction ran: the question is shown as it was, or summarized with the rest.
    summary = prepared.summary
    summarized = summary is not None and summary.covered_from <= 2 <= summary.covered_to
    assert "Where is order 42?" in texts or summarized
    assert "Then refund it." in texts
    assert "a2 " not in texts and "a3 " not in texts

    assert (await client.prepare(_request(a, "a3"))).model_dump_json() == parent_before
    assert (await client.inspect(a.thread_id, limit=100)).model_dump_json() == inspection_before
    assert (await client.inspect_session(a.session_id)).model_dump_json() == session_before
    assert await _export(client, a.session_id) == export_before
    assert await db.fetch(_VIEW, a.thread_id) == views_before
    assert await _summaries(db, a.thread_id) == 1


_VIEW = "SELECT * FROM ctx.thread_views WHERE thread_id = $1"
_SETTLED = """
SELECT v.summary_id IS NOT NULL AND v.pending_fingerprint IS NULL AND v.evaluated_revision = h.revision
FROM ctx.thread_views v JOIN ctx.thread_heads h USING (thread_id) WHERE v.thread_id = $1
"""


async def _settled(db: asyncpg.Connection, thread_id: str) -> bool:
    """A summary committed and nothing left to evaluate: the thread's view stays as it is."""
    return bool(await db.fetchval(_SETTLED, thread_id))


async def test_fork_requests_answer_typed_errors_over_nats(fleet, client: FleetClient) -> None:
    a = Thread()
    await client.append(a.user("go", key="q"))
    await client.append(a.assistant("", calls=(("c1", "ls", {}),), key="a1"))
    await eventually(lambda: _recorded(client, a, 2), what="the parent's records")
    cases = [
        (ForkRequest(session_id="no-such-session", at_seq=1, new_session_id="n1"), ThreadNotFound),
        (ForkRequest(session_id=a.session_id, at_seq=9, new_session_id="n2"), SeqOutOfRange),
        (ForkRequest(session_id=a.session_id, at_seq=2, new_session_id="n3"), ForkInsideToolGroup),
        (ForkRequest(session_id=a.session_id, at_seq=1, new_session_id=a.session_id), SessionExists),
    ]
    for request, error in cases:
        with pytest.raises(error):
            await client.fork_session(request)


async def _recorded(client: FleetClient, t: Thread, n: int) -> bool:
    try:
        return (await client.inspect(t.thread_id, limit=1)).record_count >= n
    except ThreadNotFound:
        return False


async def test_a_prepare_on_a_fork_waits_for_its_own_event_like_any_thread(
    fleet, client: FleetClient
) -> None:
    a = Thread()
    await client.append(a.user("Where is order 42?", key="q"))
    await eventually(lambda: _recorded(client, a, 1), what="the parent's record")
    forked = await client.fork_session(
        ForkRequest(session_id=a.session_id, at_seq=1, new_session_id=f"{a.session_id}-w")
    )
    f = Thread(session_id=forked.session_id)
    await client.append(f.assistant("Checking the carrier.", key="f1"))
    prepared: PreparedContext = await client.prepare(_request(f, "f1"))
    assert [m.content for m in prepared.messages][-2:] == ["Where is order 42?", "Checking the carrier."]
    inspection = await client.inspect(f.thread_id, limit=1)
    assert inspection.record_count == 1 and inspection.session_id == forked.session_id


async def test_a_runtime_may_ask_for_a_fork_but_the_server_refuses_it_an_export(
    secured_nats: SecuredNats,
) -> None:
    nc = await nats.connect(
        secured_nats.url,
        user="runtime-acme",
        password=secured_nats.passwords["runtime-acme"],
        inbox_prefix="_INBOX.runtime-acme",
        error_cb=_ignore,
    )
    try:
        await nc.publish("ctx.session.fork.acme", b"{}")
        await nc.publish("ctx.session.export.acme.s1", b"{}")
        await nc.flush()
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
    logged = "\n".join(secured_nats.violations())
    assert "ctx.session.export.acme.s1" in logged and "ctx.session.fork" not in logged


async def _ignore(exc: Exception) -> None:
    """The refused publish is reported here too; the server's log is what the test reads."""
