"""The proxy's reading of provider requests and errors, as values (no servers)."""

from __future__ import annotations

from typing import Any

import pytest

from services.edge.proxy import Family, find_thread, profile_of
from services.edge.proxy.answers import Overflow, read_overflow
from services.edge.proxy.reading import read_request
from contracts.exceptions import InvalidRequest


def _chat(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": list(messages)}


SYSTEM = {"role": "system", "content": "You fix bugs."}
ASK = {"role": "user", "content": "Fix the parser."}


def test_profile_of_a_dated_model_is_the_longest_profile_it_starts_with() -> None:
    assert profile_of("gpt-4o-audio-preview") == "gpt-4o"
    assert profile_of("gpt-4o-mini-tts") == "gpt-4o-mini"
    assert profile_of("claude-sonnet-4-20250514") == "claude-sonnet-4"
    assert profile_of("gpt-4oo") is None and profile_of("llama-3") is None


def test_event_keys_depend_on_position_and_content_only() -> None:
    once = read_request(Family.CHAT, _chat(SYSTEM, ASK)).items
    longer = read_request(Family.CHAT, _chat(SYSTEM, ASK, {"role": "assistant", "content": "Ok."}, ASK)).items
    assert [i.event_key for i in longer[:2]] == [i.event_key for i in once]
    assert longer[3].event_key != longer[1].event_key  # the same words later are another event
    assert once[0].event_key.startswith("px/0.0/")


def test_find_thread_derives_one_thread_for_every_request_of_a_conversation() -> None:
    first = read_request(Family.CHAT, _chat(SYSTEM, ASK))
    later = read_request(Family.CHAT, _chat(SYSTEM, ASK, {"role": "assistant", "content": "Ok."}))
    other = read_request(Family.CHAT, _chat(SYSTEM, {"role": "user", "content": "Another task."}))
    assert find_thread({}, first) == find_thread({}, later) != find_thread({}, other)
    assert find_thread({"ctx-thread": "run-1"}, first).run_id == "run-1"


def test_find_thread_refuses_a_header_that_is_no_identifier() -> None:
    with pytest.raises(InvalidRequest):
        find_thread({"ctx-thread": "a.b"}, read_request(Family.CHAT, _chat(ASK)))


def test_anthropic_tool_results_become_outcomes_with_their_error_status() -> None:
    body = {
        "model": "claude-sonnet-4",
        "system": "You fix bugs.",
        "messages": [
            {"role": "user", "content": "Fix it."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "run", "input": {}}]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "E"}],
            },
        ],
    }
    items = read_request(Family.MESSAGES, body).items
    assert [i.label for i in items] == ["system", "0.0", "1.0", "2.0"]
    outcome = items[-1].payload.model_dump()
    assert (outcome["call_id"], outcome["status"], outcome["text"]) == ("t1", "error", "E")


def test_read_request_refuses_what_it_cannot_record() -> None:
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    for body in (
        {"messages": [ASK]},
        _chat(image),
        _chat(SYSTEM),
        "text",
        {"model": "gpt-4o", "messages": []},
    ):
        with pytest.raises(InvalidRequest):
            read_request(Family.CHAT, body)
    with pytest.raises(InvalidRequest):
        read_request(Family.RESPONSES, {"model": "gpt-4o", "input": "hi", "previous_response_id": "resp_1"})


def test_read_overflow_knows_each_providers_context_length_refusal_and_nothing_else() -> None:
    openai_error = {
        "error": {
            "code": "context_length_exceeded",
            "message": (
                "This model's maximum context length is 128000 tokens. "
                "However, your messages resulted in 130001 tokens."
            ),
        }
    }
    anthropic_error = {
        "type": "error",
        "error": {"message": "prompt is too long: 210000 tokens > 200000 maximum"},
    }
    assert read_overflow(Family.CHAT, 400, openai_error) == Overflow(limit=128000, count=130001)
    assert read_overflow(Family.MESSAGES, 400, anthropic_error) == Overflow(limit=200000, count=210000)
    assert read_overflow(Family.CHAT, 429, openai_error) is None
    assert read_overflow(Family.CHAT, 400, {"error": {"code": "invalid_value", "message": "x"}}) is None
