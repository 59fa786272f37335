"""The indexer's chunks: whole lines of ~4 KiB, a longer line cut into pieces that each fit a tsvector."""

from __future__ import annotations

from services.app.indexing import chunk_text


def test_chunk_text_keeps_short_lines_whole_with_their_byte_and_line_spans() -> None:
    text = "first line\nsecond line\n"
    assert chunk_text(text) == [(0, 23, 1, 2, text)]
    assert chunk_text("") == [(0, 0, 1, 1, "")]


def test_chunk_text_cuts_a_line_longer_than_a_chunk_at_spaces_into_pieces_of_at_most_4_kib() -> None:
    line = " ".join(f"w{n:07d}" for n in range(2_000))  # 18 KB on one line
    text = f"before\n{line}\nafter\n"
    chunks = chunk_text(text)
    assert "".join(c[4] for c in chunks) == text
    assert all(len(c[4].encode()) <= 4096 for c in chunks)
    # Spans tile the text; every piece of the long line is on line 2 (its first piece does not fit
    # beside "before", its last shares a chunk with "after").
    assert [c[0] for c in chunks[1:]] == [c[1] for c in chunks[:-1]]
    assert [(c[2], c[3]) for c in chunks] == [(1, 1), (2, 2), (2, 2), (2, 2), (2, 2), (2, 3)]
    assert all(text.encode()[c[0] : c[1]].decode() == c[4] for c in chunks)
    # Cut after a space, never inside a word.
    assert all(c[4].endswith(" ") for c in chunks[1:-1])


def test_chunk_text_cuts_a_line_without_spaces_between_characters() -> None:
    line = "é" * 5_000  # 10,000 bytes, two per character, no space
    chunks = chunk_text(line)
    assert "".join(c[4] for c in chunks) == line
    assert [len(c[4].encode()) for c in chunks] == [4096, 4096, 1808]
