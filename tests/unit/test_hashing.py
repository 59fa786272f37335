"""The per-thread hash chain."""

from __future__ import annotations

from dataclasses import replace

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
