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


class _CountingEncoding:
    """An encoding that counts how often it encodes a whole text."""

    def __init__(self, inner: object) -> None:
        self._inner = inner
        self.encodes = 0

    def encode_ordinary(self, text: str) -> list[int]:
        self.encodes += 1
        return self._inner.encode_ordinary(text)  # type: ignore[attr-defined, no-any-return]

    def decode(self, ids: list[int]) -> str:
        return self._inner.decode(ids)  # type: ignore[attr-defined, no-any-return]


def _counting(name: tokens.EncodingName) -> tuple[TokenCounter, _CountingEncoding]:
    counter = TokenCounter(name)
    encoding = _CountingEncoding(counter._enc)
    counter._enc = encoding  # type: ignore[assignment]
    return counter, encoding


def test_a_tool_output_cut_right_after_it_was_counted_is_encoded_once() -> None:
    text = " ".join(f"line {i} of the build log" for i in range(2000))
    counter, encoding = _counting("o200k_base")
    full = counter.count(text)
    cut = counter.head_tail(text, head_tokens=300, tail_tokens=200)
    assert encoding.encodes == 1
    # The same cut as from a counter that never saw the text.
    assert cut == TokenCounter("o200k_base").head_tail(text, head_tokens=300, tail_tokens=200)
    assert full == TokenCounter("o200k_base").count(text)


def test_ids_of_a_text_over_the_bound_are_not_kept_and_its_cut_encodes_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tokens, "_KEEP_IDS", 50)
    text = " ".join(f"word{i}" for i in range(1000))
    counter, encoding = _counting("o200k_base")
    counter.count(text)
    assert counter._last[2] is None
    cut = counter.head_tail(text, head_tokens=10, tail_tokens=5)
    assert encoding.encodes == 2
    assert cut == TokenCounter("o200k_base").head_tail(text, head_tokens=10, tail_tokens=5)
