"""The per-thread hash chain."""

from __future__ import annotations

import enum
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.core.hashing import (
    GENESIS_HASH,
    ChainLink,
    canonical_json,
    chain_hash,
    sha256_hex,
    verify_chain,
)


def _chain(thread: str, contents: list[str]) -> list[ChainLink]:
    links, prev = [], GENESIS_HASH
    for seq, content in enumerate(contents, start=1):
        sha = sha256_hex(content.encode())
        record_hash = chain_hash(prev, thread, seq, sha)
        links.append(ChainLink(seq, sha, prev, record_hash))
        prev = record_hash
    return links


def test_verify_chain_accepts_an_intact_chain() -> None:
    assert verify_chain("r.main", _chain("r.main", ["a", "b", "c"])) is None


def test_verify_chain_finds_edited_missing_reordered_or_foreign_records() -> None:
    links = _chain("r.main", ["a", "b", "c"])
    edited = [links[0], replace(links[1], content_sha256=sha256_hex(b"B")), links[2]]
    assert "seq 2" in (verify_chain("r.main", edited) or "")
    assert "seq 3 found where 2" in (verify_chain("r.main", [links[0], links[2]]) or "")
    assert verify_chain("r.main", [links[1], links[0], links[2]]) is not None
    assert verify_chain("other.main", links) is not None


def test_canonical_json_is_key_order_and_whitespace_independent() -> None:
    assert canonical_json({"b": 1, "a": [1, {"y": 2, "x": "é"}]}) == canonical_json(
        {"a": [1, {"x": "é", "y": 2}], "b": 1}
    )


def _as_json_writes_it(value: Any) -> bytes:
    """How every stored content hash was made: the json module, sorted keys, compact, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_keys = st.text(max_size=8)
_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(_values)
def test_a_content_hash_is_made_from_the_bytes_the_json_module_writes(value: Any) -> None:
    assert canonical_json(value) == _as_json_writes_it(value)


class _Kind(str, enum.Enum):
    TOOL = "tool"


@pytest.mark.parametrize(
    "value",
    [
        {"every code point": "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)},
        {"z": 1, "é": 2, "\uffff": 3, "😀": 4, "": 5, "Z": 6, "\x7f": 7},
        {"float": 1e16, "small": 1e-05, "neg zero": -0.0},
        {"big": 2**64 + 1},
        {"kind": _Kind.TOOL},
        {"tuple": (1, "a")},
        {1: "an int key"},
    ],
    ids=["code-points", "key-order", "floats", "big-int", "enum", "tuple", "int-key"],
)
def test_values_orjson_would_write_otherwise_keep_the_json_modules_bytes(value: Any) -> None:
    assert canonical_json(value) == _as_json_writes_it(value)


def test_a_lone_surrogate_fails_as_it_always_did() -> None:
    # Decoded events never hold one (contracts/events.py); were one to reach here, no hash is made.
    with pytest.raises(UnicodeEncodeError):
        _as_json_writes_it({"s": "\ud800 lone"})
    with pytest.raises(UnicodeEncodeError):
        canonical_json({"s": "\ud800 lone"})
