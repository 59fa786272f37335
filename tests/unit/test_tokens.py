"""tiktoken encodings load from the package, verified, with no network."""

from __future__ import annotations

import os
import socket

import pytest

from services.core import tokens
from services.core.tokens import ENCODINGS, TokenCounter, counter_for, estimate_tokens


def test_encodings_load_offline_from_shipped_files(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("tried to reach the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    tokens._loaded.clear()
    tokens._counters.clear()
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    for name in ENCODINGS:
        counter = TokenCounter(name)
        assert counter.count("hello world") == 2
    assert os.environ.get("TIKTOKEN_CACHE_DIR") == before


def test_shipped_encoding_with_a_wrong_hash_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tokens._SOURCES, "cl100k_base", tokens._Source("x", "0" * 64))
    with pytest.raises(tokens.TokenizerDataError, match="sha256"):
        tokens._read_shipped("cl100k_base")


def test_counts_differ_by_encoding_and_estimate_is_bytes_over_four() -> None:
    text = "django/db/models/query.py:1101 E1101 ünïcödé"
    assert counter_for("o200k_base").count(text) > 0 and counter_for("cl100k_base").count(text) > 0
    assert estimate_tokens("abcd" * 10) == 10 and estimate_tokens("é") == 1
    assert counter_for("o200k_base").count("") == 0


def test_special_token_text_is_counted_as_ordinary_text() -> None:
    assert counter_for("o200k_base").count("<|endoftext|>") > 1


def test_head_tail_cuts_on_token_boundaries() -> None:
    text = " ".join(f"word{i}" for i in range(1000))
    head, tail = counter_for("o200k_base").head_tail(text, head_tokens=10, tail_tokens=5)
    assert text.startswith(head) and text.endswith(tail)
    assert counter_for("o200k_base").count(head) == 10
