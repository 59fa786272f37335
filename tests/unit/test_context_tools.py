"""Context tools: schemas in the reply, counted; previews naming the tool; the client's executor."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from contracts import (
    BlockKind,
    PreparedContext,
    PrepareRequest,
    Purpose,
    ReadReply,
    ReadRequest,
    SearchHit,
    SearchReply,
    SearchRequest,
    ToolSchema,
    ToolStatus,
)
from services.core.assemble import ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from services.core.context_tools import (
    CONTEXT_READ,
    CONTEXT_SEARCH,
    BlobRef,
    RecordRef,
    context_tool_schemas,
    parse_ref,
    record_ref,
)
from services.core.records import LedgerRecord
from services.core.render import MESSAGE_OVERHEAD
from services.core.request_tokens import count_prepared
from services.core.tokens import counter_for
from ctxfleet_client import ContextTools
from ctxfleet_client.context_tools import tool_calls_of
from contracts.exceptions import ContentNotFound, FleetUnavailable, InvalidRequest
from tests.fixtures.builders import Thread, ledger_records

COUNTER = counter_for("o200k_base")
SHA = "ab" * 32
BLOB = f"ctx://blob/{SHA}"


def _prepare(t: Thread, records: list[LedgerRecord], budget: int = 100_000, **fields: Any) -> PreparedContext:
    req = PrepareRequest.model_validate(
        {
            "session_id": t.session_id,
            "run_id": t.run_id,
            "instance_id": t.instance_id,
            "budget_tokens": budget,
        }
        | fields
    )
    snapshot = ThreadSnapshot(
        t.session_id,
        t.run_id,
        t.instance_id,
        len(records),
        records[-1].seq,
        records[-1].event_key,
        records,
        own_thread=t.thread_id,
    )
    return assemble_context(snapshot, req, resolve_budget(req), COUNTER)


def _thread(t: Thread, groups: int, output: str) -> list[LedgerRecord]:
    events: list[Any] = [t.system("You are careful."), t.user("Fix the failing test in app.py")]
    for n in range(groups):
        events += [
            t.assistant(calls=((f"c{n}", "bash", {"cmd": f"cat log{n}.txt"}),)),
            t.outcome(f"c{n}", output.format(n=n)),
        ]
    records = ledger_records(events)
    return [replace(r, thread_id=t.thread_id, thread_seq=r.seq) for r in records]


# --- the reply --------------------------------------------------------------------------------


def test_context_tools_follow_the_requests_tools_and_count_as_tool_schemas() -> None:
    t = Thread()
    records = _thread(t, 1, "ok")
    bash = ToolSchema(name="bash", description="Run a command.", parameters={"type": "object"})
    plain = _prepare(t, records, tools=[bash.model_dump()])
    with_tools = _prepare(t, records, tools=[bash.model_dump()], context_tools=True)
    assert [c.function.name for c in with_tools.tools] == ["bash", CONTEXT_READ, CONTEXT_SEARCH]
    read = with_tools.tools[1].function.parameters["properties"]
    assert isinstance(read, dict) and {"ref", "start_line", "end_line", "offset", "length"} <= set(read)
    assert with_tools.budget_report.used.tool_schemas > plain.budget_report.used.tool_schemas
    independent = count_prepared(with_tools, COUNTER)
    assert independent <= with_tools.budget_report.used.total <= independent + 2 * 3 + 1
    assert with_tools.prepared_id != plain.prepared_id


def test_the_note_follows_the_instructions_and_says_how_to_read_previews() -> None:
    t = Thread()
    prepared = _prepare(t, _thread(t, 1, "ok"), context_tools=True)
    assert [b.block_id for b in prepared.blocks[:3]] == [
        "instruction:1",
        "instruction:context_tools",
        "task:2",
    ]
    note = prepared.messages[1]
    assert (
        note.role == "system"
        and CONTEXT_READ in (note.content or "")
        and "ctx://blob/" in (note.content or "")
    )
    assert prepared.blocks[1].tokens == COUNTER.count(note.content or "") + MESSAGE_OVERHEAD
    # Counted as instructions, whole, like every instruction block.
    instructions = sum(b.tokens for b in prepared.blocks if b.kind is BlockKind.INSTRUCTION)
    assert prepared.budget_report.used.instructions == instructions


def test_off_the_reply_has_no_context_tools_no_note_and_the_same_id() -> None:
    t = Thread()
    records = _thread(t, 1, "ok")
    default = _prepare(t, records)
    off = _prepare(t, records, context_tools=False)
    assert (
        off == default
        and off.tools == ()
        and "instruction:context_tools" not in {b.block_id for b in off.blocks}
    )


def test_a_request_tool_under_a_context_tool_name_is_refused() -> None:
    t = Thread()
    records = _thread(t, 1, "ok")
    with pytest.raises(InvalidRequest) as err:
        _prepare(t, records, tools=[{"name": CONTEXT_SEARCH}], context_tools=True)
    assert err.value.details["conflicting"] == [CONTEXT_SEARCH]
    # Without the flag the name is the runtime's own business.
    assert _prepare(t, records, tools=[{"name": CONTEXT_SEARCH}]).tools[0].function.name == CONTEXT_SEARCH


def test_a_compaction_context_gets_no_context_tools() -> None:
    t = Thread()
    prepared = _prepare(t, _thread(t, 1, "ok"), purpose=Purpose.COMPACTION, context_tools=True)
    assert prepared.tools == () and all(b.block_id != "instruction:context_tools" for b in prepared.blocks)


def test_every_preview_names_context_read_with_its_ref() -> None:
    t = Thread()
    big = "".join(f"line {{n}}.{i}: a fairly long log line of the build\n" for i in range(600))
    records = _thread(t, 5, big)
    full = _prepare(t, records, context_tools=True)
    head_tail = [m.content or "" for m in full.messages if m.role == "tool"]
    # The recorder's head + tail of each long output.
    assert all(f"read it back with {CONTEXT_READ}(ref=ctx://blob/" in c for c in head_tail)
    assert all("read it back from" not in c for c in head_tail)
    masked = _prepare(t, records, budget=full.budget_report.used.total * 2 // 3, context_tools=True)
    previews = [m.content or "" for m in masked.messages if "output masked" in (m.content or "")]
    assert previews and all(f"read it back with {CONTEXT_READ}(ref=ctx://blob/" in c for c in previews)
    assert count_prepared(masked, COUNTER) <= masked.budget_report.used.total
    # The instruction beside the tools says it in the previews' own words.
    note = next(m.content or "" for m in full.messages if (m.content or "").startswith("[context tools]"))
    assert f'"read it back with {CONTEXT_READ}(ref=ctx://blob/<sha256>)"' in note
    assert "read it back from" not in note
    # Off, the same thread reads exactly as before.
    plain = _prepare(t, records)
    assert all(
        "read it back from ctx://blob/" in (m.content or "") for m in plain.messages if m.role == "tool"
    )


def test_an_output_cut_at_assembly_names_context_read_and_a_record_ref() -> None:
    t = Thread()
    text = "word " * 700  # under the recorder's limits: no blob, no preview
    events = [t.system("Sys."), t.user("go"), t.assistant(calls=(("a", "bash", {}),)), t.outcome("a", text)]
    records = ledger_records(events, mask_min_chars=10_000, blob_min_bytes=1 << 20)
    records = [replace(r, thread_id=t.thread_id, thread_seq=r.seq) for r in records]
    full = _prepare(t, records, context_tools=True)
    cut = _prepare(t, records, budget=full.budget_report.used.total - 300, context_tools=True)
    content = cut.messages[-1].content or ""
    assert f"read it back with {CONTEXT_READ}(ref={record_ref(t.thread_id, 4)})" in content
    assert count_prepared(cut, COUNTER) <= cut.budget_report.used.total <= cut.budget_report.input_budget


def test_each_provider_shape_carries_the_context_tools() -> None:
    t = Thread()
    records = _thread(t, 1, "ok")
    anthropic = _prepare(t, records, context_tools=True, format="anthropic.messages").request or {}
    responses = _prepare(t, records, context_tools=True, format="openai.responses").request or {}
    for body in (anthropic, responses):
        tools = body["tools"]
        assert isinstance(tools, list)
        assert [tool["name"] for tool in tools if isinstance(tool, dict)] == [CONTEXT_READ, CONTEXT_SEARCH]


def test_refs_parse_both_ways() -> None:
    assert parse_ref(BLOB) == BlobRef(SHA) and BlobRef(SHA).ref == BLOB
    assert parse_ref("ctx://record/r1.main/17") == RecordRef("r1.main", 17)
    assert RecordRef("r1.main", 17).ref == "ctx://record/r1.main/17"
    for bad in ("ctx://blob/abc", "ctx://record/r1/3", "ctx://record/r1.main/0", f"{BLOB}/x", ""):
        assert parse_ref(bad) is None
    assert [s.name for s in context_tool_schemas()] == [CONTEXT_READ, CONTEXT_SEARCH]


# --- the executor -----------------------------------------------------------------------------


class _Fleet:
    """A client that records what the executor asked, answering from one blob of one session."""

    def __init__(self, content: str, *, fail: Exception | None = None) -> None:
        self.content = content.encode()
        self.fail = fail
        self.reads: list[ReadRequest] = []
        self.searches: list[SearchRequest] = []

    async def read(self, request: ReadRequest, *, timeout: float = 10.0) -> ReadReply:
        self.reads.append(request)
        if self.fail is not None:
            raise self.fail
        if request.session_id != "s1":
            raise ContentNotFound(request.ref)
        if request.line is not None and request.lines is not None:
            lines = self.content.decode().splitlines(keepends=True)
            return ReadReply(
                ref=request.ref,
                total_bytes=len(self.content),
                total_lines=len(lines),
                offset=0,
                content="".join(lines[request.line - 1 : request.line - 1 + request.lines]),
                next_offset=None,
                line=request.line,
                next_line=request.line + request.lines,
                sha256_verified=True,
            )
        end = request.offset + request.length
        return ReadReply(
            ref=request.ref,
            total_bytes=len(self.content),
            total_lines=1,
            offset=request.offset,
            content=self.content[request.offset : end].decode(),
            next_offset=end,
            sha256_verified=True,
        )

    async def search(self, request: SearchRequest, *, timeout: float = 10.0) -> SearchReply:
        self.searches.append(request)
        hit = SearchHit(
            thread_id="r1.main",
            seq=7,
            kind="tool_outcome",
            event_key="o7",
            recorded_at="2026-01-01T00:00:00Z",  # type: ignore[arg-type]
            snippet="an «E1101» in app.py",
            start_byte=0,
            end_byte=10,
            start_line=3,
            end_line=4,
            rank=0.5,
            superseded=False,
        )
        return SearchReply(hits=(hit,))


def _tools(fleet: _Fleet, session: str = "s1") -> ContextTools:
    return ContextTools(fleet, session_id=session, run_id="r1", instance_id="main", principal_id="alice")


def _chat(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    tool_calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in calls
    ]
    return {"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": tool_calls}}]}


@pytest.mark.anyio
async def test_a_byte_range_is_read_and_answered_as_an_outcome_other_tools_are_left() -> None:
    fleet = _Fleet("x" * 40_000 + "y" * 1_000 + "z" * 100)
    response = _chat(
        ("c1", "bash", {"cmd": "ls"}), ("c2", CONTEXT_READ, {"ref": BLOB, "offset": 40_000, "length": 1_000})
    )
    answered = await _tools(fleet).answer(response)
    assert [c.call_id for c in answered.others] == ["c1"]
    (answer,) = answered.answers
    assert fleet.reads == [
        ReadRequest(session_id="s1", principal_id="alice", ref=BLOB, offset=40_000, length=1_000)
    ]
    outcome = answered.outcomes[0]
    assert outcome.payload.call_id == "c2" and outcome.payload.status is ToolStatus.SUCCESS
    header, body = outcome.payload.text.split("\n", 1)
    assert body == "y" * 1_000 and "bytes 40000–41000 of 41100" in header and "next offset 41000" in header
    assert (outcome.session_id, outcome.run_id, outcome.instance_id) == ("s1", "r1", "main")
    assert answer.refused is None and isinstance(answer.reply, ReadReply)
    # Answering the same call again gives the same event: a retry, not a second outcome.
    assert (await _tools(fleet).answer(response)).outcomes == answered.outcomes


@pytest.mark.anyio
async def test_a_line_range_maps_to_line_and_lines() -> None:
    fleet = _Fleet("".join(f"l{i}\n" for i in range(1, 20)))
    anthropic = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "reading"},
            {
                "type": "tool_use",
                "id": "tu1",
                "name": CONTEXT_READ,
                "input": {"ref": BLOB, "start_line": 3, "end_line": 5},
            },
        ],
    }
    answered = await _tools(fleet).answer(anthropic)
    assert (fleet.reads[0].line, fleet.reads[0].lines) == (3, 3)
    assert answered.outcomes[0].payload.text.split("\n", 1)[1] == "l3\nl4\nl5\n"
    assert "lines 3–5 of 19" in answered.outcomes[0].payload.text


@pytest.mark.anyio
async def test_search_answers_hits_with_their_refs_and_kind_filter() -> None:
    fleet = _Fleet("")
    responses = {
        "output": [
            {
                "type": "function_call",
                "call_id": "fc1",
                "name": CONTEXT_SEARCH,
                "arguments": '{"query": "E1101", "kind": "tool_outcome"}',
            }
        ]
    }
    answered = await _tools(fleet).answer(responses)
    assert fleet.searches[0].query == "E1101" and fleet.searches[0].kinds == ("tool_outcome",)
    assert fleet.searches[0].principal_id == "alice"
    text = answered.outcomes[0].payload.text
    assert "ctx://record/r1.main/7 (tool_outcome, lines 3–4): an «E1101» in app.py" in text


@pytest.mark.anyio
async def test_refusals_are_error_outcomes_never_content_and_retryable_errors_raise() -> None:
    fleet = _Fleet("secret")
    foreign = await _tools(fleet, session="s2").answer(_chat(("c1", CONTEXT_READ, {"ref": BLOB})))
    assert foreign.answers[0].refused == "not_found" and foreign.answers[0].reply is None
    payload = foreign.outcomes[0].payload
    assert payload.status is ToolStatus.ERROR and "secret" not in payload.text and "not_found" in payload.text
    bad = [
        {"ref": "ctx://blob/nothex"},
        {"ref": BLOB, "start_line": 2, "offset": 5},
        {"ref": BLOB, "start_line": 5, "end_line": 2},
        {"ref": BLOB, "offset": 1.5},
        {"ref": BLOB, "length": 0},
        {"ref": "ctx://record/r1.main/0"},
    ]
    answered = await _tools(fleet).answer(_chat(*((f"b{n}", CONTEXT_READ, a) for n, a in enumerate(bad))))
    assert [a.refused for a in answered.answers] == ["invalid_request"] * len(bad)
    assert len(fleet.reads) == 1  # only the foreign read reached the fleet
    not_json = {
        "choices": [
            {
                "message": {
                    "tool_calls": [
                        {
                            "id": "x",
                            "type": "function",
                            "function": {"name": CONTEXT_SEARCH, "arguments": "{oops"},
                        }
                    ]
                }
            }
        ]
    }
    assert (await _tools(fleet).answer(not_json)).answers[0].refused == "invalid_request"
    with pytest.raises(FleetUnavailable):
        await _tools(_Fleet("", fail=FleetUnavailable("down"))).answer(
            _chat(("c1", CONTEXT_READ, {"ref": BLOB}))
        )


def test_tool_calls_are_found_in_every_shape() -> None:
    chat = _chat(("a", "bash", {"x": 1}))
    assert tool_calls_of(chat) == tool_calls_of(chat["choices"][0]["message"])
    assert tool_calls_of(chat["choices"][0]["message"]["tool_calls"])[0].arguments == {"x": 1}
    assert tool_calls_of({"content": [{"type": "text", "text": "no calls"}]}) == ()
    assert tool_calls_of("not a response") == ()
