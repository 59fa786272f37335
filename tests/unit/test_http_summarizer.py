"""The OpenAI-compatible summarizer against a scripted local server: requests, answers, error mapping."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from services.edge.http_summarizer import (
    SUMMARY_INSTRUCTION,
    HttpSummarizer,
    HttpSummarizerConfig,
    summary_schema,
)
from services.core.compaction.model import (
    Segment,
    SegmentTooLong,
    SourcedText,
    StructuredSummary,
    SummarizerFailed,
)
from services.core.records import LedgerRecord
from services.core.render import TokenCounts
from tests.fixtures.scripted_openai import ScriptedOpenAI, scripted_openai  # noqa: F401

pytestmark = pytest.mark.anyio

KEY = "sk-test-SECRET-0123456789"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # urllib honours proxy variables; the scripted server must be reached directly.
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def _record(seq: int, kind: str, text: str, **payload: Any) -> LedgerRecord:
    return LedgerRecord(
        seq, f"k{seq}", kind, {"text": text, **payload}, text, TokenCounts(o200k_base=5, cl100k_base=5)
    )


def _segment(parent: StructuredSummary | None = None, instruction: str = "") -> Segment:
    records = [
        _record(11, "user_input", "Fix the crash in src/app.py"),
        _record(
            12,
            "assistant_message",
            "Reading the file.",
            tool_calls=[{"call_id": "call_A1", "name": "read_file", "args": {"path": "src/app.py"}}],
        ),
        _record(13, "tool_outcome", "ENOENT: src/app.py", call_id="call_A1", status="error"),
    ]
    return Segment(records=records, parent=parent, instruction=instruction)


ANSWER: dict[str, Any] = {
    "goal": {"text": "Fix the crash in src/app.py", "sources": [11]},
    "current_request": None,
    "constraints": [],
    "decisions": [],
    "progress": [],
    "files_read": [],
    "files_modified": [],
    "failures": [
        {
            "call_id": "call_A1",
            "name": "read_file",
            "status": "error",
            "detail": "ENOENT",
            "sources": [12, 13],
        }
    ],
    "unresolved": [{"text": "src/app.py was not found", "sources": [13]}],
    "next_steps": [],
    "references": ["src/app.py"],
}


def _chat(content: str | None, finish_reason: str = "stop", **message: Any) -> tuple[int, dict[str, Any]]:
    return 200, {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "finish_reason": finish_reason,
                "message": {"role": "assistant", "content": content, **message},
            }
        ],
        "usage": {"prompt_tokens": 321, "completion_tokens": 45, "total_tokens": 366},
    }


def _responses(text: str, **extra: Any) -> tuple[int, dict[str, Any]]:
    return 200, {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
        ],
        "usage": {"input_tokens": 300, "output_tokens": 40, "total_tokens": 340},
        **extra,
    }


def _summarizer(server: ScriptedOpenAI, api: str = "chat_completions", **cfg: Any) -> HttpSummarizer:
    return HttpSummarizer(
        HttpSummarizerConfig(base_url=server.base_url, model="m-1", api_key=KEY, api=api, **cfg)
    )  # type: ignore[arg-type]


def _expected(segment: Segment) -> StructuredSummary:
    return StructuredSummary.model_validate(
        {**ANSWER, "covered_from": segment.first_seq, "covered_to": segment.last_seq}
    )


async def _failure(server: ScriptedOpenAI, reply: Any, api: str = "chat_completions") -> SummarizerFailed:
    server.script([reply])
    with pytest.raises(SummarizerFailed) as info:
        await _summarizer(server, api).summarize(_segment())
    assert KEY not in str(info.value)
    return info.value


@pytest.fixture
def free_port() -> Iterator[int]:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


async def test_http_summarizer_chat_completions_returns_summary_and_sends_schema_transcript_and_key(
    scripted_openai: ScriptedOpenAI,
) -> None:
    scripted_openai.script([_chat(json.dumps(ANSWER))])
    summarizer = _summarizer(scripted_openai)
    segment = _segment(instruction="Focus on the crash.")

    summary = await summarizer.summarize(segment)

    assert summary == _expected(segment)
    assert (summary.covered_from, summary.covered_to) == (11, 13)
    (request,) = scripted_openai.requests
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    body = request.body
    assert "tools" not in body and body["model"] == "m-1" and body["max_tokens"] == 2000
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "structured_summary", "strict": True, "schema": summary_schema()},
    }
    system, user = body["messages"]
    assert system == {"role": "system", "content": SUMMARY_INSTRUCTION + "\n\nFocus on the crash."}
    assert user["role"] == "user"
    assert "[seq 11] user_input\nFix the crash in src/app.py" in user["content"]
    assert 'call call_A1 read_file({"path":"src/app.py"})' in user["content"]
    assert (
        "[seq 13] tool_outcome call_id=call_A1 status=error\n[tool status: error]\nENOENT" in user["content"]
    )
    assert (summarizer.calls, summarizer.last_usage) == (1, {"input_tokens": 321, "output_tokens": 45})


async def test_http_summarizer_responses_api_returns_summary_and_sends_text_format(
    scripted_openai: ScriptedOpenAI,
) -> None:
    scripted_openai.script([_responses(json.dumps(ANSWER))])
    summarizer = _summarizer(scripted_openai, "responses", max_output_tokens=700)
    segment = _segment()

    summary = await summarizer.summarize(segment)

    assert summary == _expected(segment)
    (request,) = scripted_openai.requests
    assert request.path == "/v1/responses"
    assert request.headers["Authorization"] == f"Bearer {KEY}"
    body = request.body
    assert "tools" not in body and body["max_output_tokens"] == 700
    assert body["text"] == {
        "format": {
            "type": "json_schema",
            "name": "structured_summary",
            "strict": True,
            "schema": summary_schema(),
        }
    }
    assert [m["role"] for m in body["input"]] == ["system", "user"]
    assert body["input"][0]["content"] == SUMMARY_INSTRUCTION
    assert "[seq 12] assistant_message\nReading the file.\ncall call_A1" in body["input"][1]["content"]
    assert (summarizer.calls, summarizer.last_usage) == (1, {"input_tokens": 300, "output_tokens": 40})


async def test_http_summarizer_responses_api_falls_back_to_top_level_output_text(
    scripted_openai: ScriptedOpenAI,
) -> None:
    scripted_openai.script(
        [(200, {"object": "response", "status": "completed", "output_text": json.dumps(ANSWER)})]
    )
    summarizer = _summarizer(scripted_openai, "responses")
    assert await summarizer.summarize(_segment()) == _expected(_segment())
    assert summarizer.last_usage is None


async def test_http_summarizer_schema_omits_covered_range_and_requires_every_property() -> None:
    schema = summary_schema()
    properties = schema["properties"]
    assert isinstance(properties, dict)
    assert "covered_from" not in properties and "covered_to" not in properties
    assert schema["required"] == list(properties)
    assert "default" not in json.dumps(schema)


async def test_http_summarizer_schema_carries_the_typed_ledger_fields_all_required_in_strict_mode() -> None:
    schema = summary_schema()
    properties = schema["properties"]
    assert isinstance(properties, dict)
    assert {"commands", "approaches_failed", "hypothesis", "folded"} <= set(properties)
    defs = schema["$defs"]
    assert isinstance(defs, dict)
    for name, fields in {
        "FileTouch": {"changes", "views"},
        "ToolFailure": {"command", "cleared_at"},
        "CommandRun": {"runs", "last_failure"},
    }.items():
        model = defs[name]
        assert isinstance(model, dict) and isinstance(model["properties"], dict)
        assert fields <= set(model["properties"]) and model["required"] == list(model["properties"])


async def test_http_summarizer_accepts_typed_ledger_fields_in_its_answer(
    scripted_openai: ScriptedOpenAI,
) -> None:
    answer = {
        **ANSWER,
        "files_read": [
            {
                "path": "src/app.py",
                "sources": [12],
                "changes": [],
                "views": [{"lines": "L1-20", "sha": "", "sources": [12, 13]}],
            }
        ],
        "commands": [
            {
                "command": "read_file src/app.py",
                "tool": "read_file",
                "runs": 1,
                "status": "error",
                "last_failure": "ENOENT",
                "sources": [12, 13],
            }
        ],
        "hypothesis": {"text": "the file was moved", "sources": [13]},
    }
    scripted_openai.script([_chat(json.dumps(answer))])
    summary = await _summarizer(scripted_openai).summarize(_segment())
    assert summary.files_read[0].views[0].lines == "L1-20" and summary.commands[0].last_failure == "ENOENT"


async def test_http_summarizer_labels_parent_summary_and_accepts_its_sources(
    scripted_openai: ScriptedOpenAI,
) -> None:
    parent = StructuredSummary(covered_from=1, covered_to=10, goal=SourcedText(text="Ship v2", sources=(4,)))
    answer = {**ANSWER, "constraints": [{"text": "Ship v2", "sources": [4]}]}
    scripted_openai.script([_chat(json.dumps(answer))])

    summary = await _summarizer(scripted_openai).summarize(_segment(parent=parent))

    assert summary.constraints == (SourcedText(text="Ship v2", sources=(4,)),)
    user = scripted_openai.requests[0].body["messages"][1]["content"]
    assert user.startswith(
        f"Parent summary of earlier records (JSON, records 1..10):\n{parent.model_dump_json()}"
    )


@pytest.mark.parametrize(
    "error",
    [
        {
            "error": {
                "code": "context_length_exceeded",
                "message": "Input too long.",
                "type": "invalid_request_error",
            }
        },
        {"object": "error", "message": "This model's maximum context length is 8192 tokens.", "code": 400},
    ],
)
async def test_http_summarizer_context_length_error_raises_segment_too_long(
    scripted_openai: ScriptedOpenAI, error: dict[str, Any]
) -> None:
    scripted_openai.script([(400, error)])
    with pytest.raises(SegmentTooLong):
        await _summarizer(scripted_openai).summarize(_segment())


async def test_http_summarizer_malformed_json_fails_malformed(scripted_openai: ScriptedOpenAI) -> None:
    assert (await _failure(scripted_openai, _chat('{"goal": '))).stage == "malformed"


async def test_http_summarizer_empty_content_fails_empty(scripted_openai: ScriptedOpenAI) -> None:
    assert (await _failure(scripted_openai, _chat(None))).stage == "empty"


async def test_http_summarizer_schema_invalid_answer_fails_malformed(scripted_openai: ScriptedOpenAI) -> None:
    invalid = {**ANSWER, "failures": [{"call_id": "call_A1", "status": "broken", "sources": [13]}]}
    assert (await _failure(scripted_openai, _chat(json.dumps(invalid)))).stage == "malformed"


async def test_http_summarizer_answer_with_covered_range_fails_malformed(
    scripted_openai: ScriptedOpenAI,
) -> None:
    answer = {**ANSWER, "covered_from": 1, "covered_to": 99}
    assert (await _failure(scripted_openai, _chat(json.dumps(answer)))).stage == "malformed"


async def test_http_summarizer_truncated_chat_answer_fails_truncated(scripted_openai: ScriptedOpenAI) -> None:
    failed = await _failure(scripted_openai, _chat(json.dumps(ANSWER)[:40], finish_reason="length"))
    assert failed.stage == "truncated"


async def test_http_summarizer_incomplete_response_fails_truncated(scripted_openai: ScriptedOpenAI) -> None:
    reply = _responses('{"goal": ', status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    assert (await _failure(scripted_openai, reply, "responses")).stage == "truncated"


async def test_http_summarizer_tool_calls_fail_tool_call(scripted_openai: ScriptedOpenAI) -> None:
    call = {"id": "call_X", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
    failed = await _failure(scripted_openai, _chat(None, finish_reason="tool_calls", tool_calls=[call]))
    assert failed.stage == "tool_call"


async def test_http_summarizer_responses_function_call_fails_tool_call(
    scripted_openai: ScriptedOpenAI,
) -> None:
    status, body = _responses(json.dumps(ANSWER))
    body["output"].append({"type": "function_call", "call_id": "c9", "name": "read_file", "arguments": "{}"})
    assert (await _failure(scripted_openai, (status, body), "responses")).stage == "tool_call"


async def test_http_summarizer_sources_outside_segment_fail_invalid_sources(
    scripted_openai: ScriptedOpenAI,
) -> None:
    answer = {**ANSWER, "decisions": [{"text": "Use pathlib", "sources": [7, 12]}]}
    failed = await _failure(scripted_openai, _chat(json.dumps(answer)))
    assert failed.stage == "invalid_sources" and "[7]" in str(failed)


async def test_http_summarizer_nested_sources_outside_segment_fail_invalid_sources(
    scripted_openai: ScriptedOpenAI,
) -> None:
    change = {"text": "str_replace", "sources": [9]}
    answer = {
        **ANSWER,
        "files_modified": [{"path": "src/app.py", "sources": [12], "changes": [change], "views": []}],
    }
    failed = await _failure(scripted_openai, _chat(json.dumps(answer)))
    assert failed.stage == "invalid_sources" and "[9]" in str(failed)


async def test_http_summarizer_http_500_fails_transport_with_status(scripted_openai: ScriptedOpenAI) -> None:
    failed = await _failure(
        scripted_openai, (500, {"error": {"message": "upstream overloaded", "type": "server_error"}})
    )
    assert failed.stage == "transport" and "HTTP 500" in str(failed) and "upstream overloaded" in str(failed)


async def test_http_summarizer_non_json_envelope_fails_malformed(scripted_openai: ScriptedOpenAI) -> None:
    assert (await _failure(scripted_openai, b"<html>gateway</html>")).stage == "malformed"


async def test_http_summarizer_connection_refused_fails_transport(free_port: int) -> None:
    summarizer = HttpSummarizer(HttpSummarizerConfig(f"http://127.0.0.1:{free_port}/v1", "m-1", api_key=KEY))
    with pytest.raises(SummarizerFailed) as info:
        await summarizer.summarize(_segment())
    assert info.value.stage == "transport" and "Connection" in str(info.value)
    assert summarizer.calls == 1 and summarizer.last_usage is None


async def test_http_summarizer_timeout_fails_transport() -> None:
    # A socket that listens but never answers: connect succeeds, the read times out.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
        summarizer = HttpSummarizer(HttpSummarizerConfig(url, "m-1", api_key=KEY, timeout_s=0.2))
        with pytest.raises(SummarizerFailed) as info:
            await summarizer.summarize(_segment())
    assert info.value.stage == "transport" and "timed out" in str(info.value)


async def test_http_summarizer_never_exposes_api_key_in_repr_or_errors(
    scripted_openai: ScriptedOpenAI,
) -> None:
    config = HttpSummarizerConfig(scripted_openai.base_url, "m-1", api_key=KEY)
    assert KEY not in repr(config) and "api_key" not in repr(config)
    # Some providers echo the key they were given in a 401 body.
    failed = await _failure(
        scripted_openai, (401, {"error": {"message": f"Incorrect API key provided: {KEY}"}})
    )
    assert failed.stage == "transport" and "HTTP 401" in str(failed) and "***" in str(failed)
    assert KEY not in repr(failed) and KEY not in str(failed.__cause__ or "")


async def test_http_summarizer_schema_and_answer_carry_the_actions_taken(
    scripted_openai: ScriptedOpenAI,
) -> None:
    schema = summary_schema()
    properties, defs = schema["properties"], schema["$defs"]
    assert isinstance(properties, dict) and isinstance(defs, dict)
    assert {"actions", "actions_folded"} <= set(properties)
    action = defs["ActionTaken"]
    assert isinstance(action, dict) and isinstance(action["properties"], dict)
    assert {"tool", "args", "status", "result", "target"} <= set(action["properties"]) and action[
        "required"
    ] == list(action["properties"])
    taken = {
        "tool": "cancel_reservation",
        "args": '{"reservation_id":"Q69X3R"}',
        "status": "success",
        "result": "cancelled",
        "call_id": "c1",
        "target": "reservation_id=Q69X3R",
        "sources": [12, 13],
    }
    scripted_openai.script([_chat(json.dumps({**ANSWER, "actions": [taken], "actions_folded": None}))])
    summary = await _summarizer(scripted_openai).summarize(_segment())
    assert [(a.tool, a.args, a.sources) for a in summary.actions] == [
        ("cancel_reservation", taken["args"], (12, 13))
    ]
