"""Token counting with tiktoken, loaded offline from encodings shipped inside this package.

tiktoken downloads its BPE files on first use; fleet machines often cannot. The two encodings the
fleet supports ship gzipped in ``services/tokenizer_data`` (2.4 MB). On first use each file is
gunzipped, its sha256 checked against the hash tiktoken itself expects, and parsed here (one
base64 token and its rank per line, tiktoken's own format); tiktoken's encoding definitions
(regex, special tokens) are used unchanged, given these ranks instead of a download, so nothing
ever touches the network, the environment or a cache directory.

UTF-8 bytes / 4 exists only as a labelled fallback (``estimate:utf8_bytes_div_4``): on real agent
traffic it undercounts by about 13%.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, Literal

import tiktoken

__all__ = [
    "ENCODINGS",
    "ESTIMATE_METHOD",
    "CountAhead",
    "EncodingName",
    "KnownCounts",
    "TokenCounter",
    "TokenizerDataError",
    "counter_for",
    "estimate_tokens",
    "knowing",
]

EncodingName = Literal["o200k_base", "cl100k_base"]
ENCODINGS: Final[tuple[EncodingName, ...]] = ("o200k_base", "cl100k_base")
ESTIMATE_METHOD: Final = "estimate:utf8_bytes_div_4"


@dataclass(frozen=True)
class _Source:
    url: str
    sha256: str


# The URL is only tiktoken's cache key here (sha1 of it); it is never fetched. The hashes are the
# `expected_hash` values in tiktoken_ext/openai_public.py and must never change.
_SOURCES: Final[dict[EncodingName, _Source]] = {
    "o200k_base": _Source(
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": _Source(
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}

_lock = threading.Lock()
_loaded: dict[EncodingName, tiktoken.Encoding] = {}


class TokenizerDataError(RuntimeError):
    """The shipped encoding file is missing or does not match its expected hash."""


def _read_shipped(name: EncodingName) -> bytes:
    ref = resources.files("services").joinpath("tokenizer_data").joinpath(f"{name}.tiktoken.gz")
    try:
        data = gzip.decompress(ref.read_bytes())
    except (FileNotFoundError, OSError) as exc:
        raise TokenizerDataError(f"shipped encoding {name} is unreadable: {exc}") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != _SOURCES[name].sha256:
        raise TokenizerDataError(
            f"shipped encoding {name} has sha256 {digest}, expected {_SOURCES[name].sha256}"
        )
    return data


def _ranks(data: bytes) -> dict[bytes, int]:
    """A ``.tiktoken`` file's mergeable ranks (what ``tiktoken.load.load_tiktoken_bpe`` returns)."""
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }


def _load(name: EncodingName) -> tiktoken.Encoding:
    from tiktoken_ext import openai_public  # type: ignore[import-untyped]

    source = _SOURCES[name]
    ranks = _ranks(_read_shipped(name))
    constructor = {"o200k_base": openai_public.o200k_base, "cl100k_base": openai_public.cl100k_base}[name]

    def shipped(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        if url != source.url or expected_hash not in (None, source.sha256):
            raise TokenizerDataError(f"tiktoken asked for {url} ({expected_hash}); only {source.url} ships")
        return ranks

    # The constructor's only I/O is this one call; it gets the shipped ranks instead (under _lock).
    fetch: Callable[..., dict[bytes, int]] = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = shipped
    try:
        spec = constructor()
    finally:
        openai_public.load_tiktoken_bpe = fetch
    return tiktoken.Encoding(
        spec["name"],
        pat_str=spec["pat_str"],
        mergeable_ranks=spec["mergeable_ranks"],
        special_tokens=spec["special_tokens"],
    )


def _encoding(name: EncodingName) -> tiktoken.Encoding:
    with _lock:
        enc = _loaded.get(name)
        if enc is None:
            enc = _loaded[name] = _load(name)
        return enc


def estimate_tokens(text: str) -> int:
    """Codex's fallback estimate: UTF-8 bytes / 4, rounded up."""
    return (len(text.encode("utf-8")) + 3) // 4


# Token ids kept for the next ``head_tail`` of the same text, at most (~2.4 MB as Python ints).
_KEEP_IDS = 65_536


class TokenCounter:
    """Counts tokens of text in one encoding; special-token text is counted as ordinary text."""

    def __init__(self, name: EncodingName) -> None:
        self.name: EncodingName = name
        self.method = f"tiktoken:{name}"
        self._enc = _encoding(name)
        # The last text counted, with its token ids: the recorder counts a tool output to decide
        # whether to trim it, then cuts it (``head_tail``) or counts the same text again as the
        # record's content. One tuple: atomic to swap between the recorder's planning thread and
        # the event loop. Ids are kept only up to ``_KEEP_IDS`` (each id is an int object).
        self._last: tuple[str, int, list[int] | None] = ("", 0, None)

    def count(self, text: str) -> int:
        if not text:
            return 0
        last_text, last_n, _ = self._last
        if text is last_text or text == last_text:
            return last_n
        ids = self._enc.encode_ordinary(text)
        n = len(ids)
        self._last = (text, n, ids if n <= _KEEP_IDS else None)
        return n

    def head_tail(self, text: str, *, head_tokens: int, tail_tokens: int) -> tuple[str, str]:
        """The first ``head_tokens`` and last ``tail_tokens`` of ``text``, cut on token boundaries."""
        last_text, _, last_ids = self._last
        # A tool output is cut right after it was counted: its ids are the ones just made.
        if last_ids is not None and (text is last_text or text == last_text):
            ids = last_ids
        else:
            ids = self._enc.encode_ordinary(text)
        return self._enc.decode(ids[:head_tokens]), self._enc.decode(ids[len(ids) - tail_tokens :])


# What ``CountAhead`` found: each text's count, with its ids when a caller may cut it (``head_tail``).
KnownCounts = dict[str, tuple[int, list[int] | None]]

# Joins the texts ``CountAhead`` encodes in one call. tiktoken encodes the text between two allowed
# special tokens on its own (its pieces never span one), so each text's ids are exactly its own.
_SEPARATOR: Final = "<|endoftext|>"


class CountAhead:
    """Texts counted before a plan asks for them: :meth:`encode` in a worker thread, then
    :meth:`known` on the loop.

    :meth:`encode` is one tiktoken call for all the texts, during which tiktoken releases the GIL, so
    the event loop goes on meanwhile; its little Python (a join, a scan for the separators) is all
    the thread needs the GIL for. A call per text would wait for the GIL after each one, up to the
    interpreter's switch interval (5 ms) while the loop is busy, and turning every id into a Python
    int would hold it for most of the count. A text holding the separator itself is counted by
    :meth:`known`, alone.
    """

    def __init__(self, counter: TokenCounter, texts: Sequence[str]) -> None:
        self._counter = counter
        unique = [t for t in dict.fromkeys(texts) if t]
        self._joined = [t for t in unique if _SEPARATOR not in t]
        self._alone = [t for t in unique if _SEPARATOR in t]
        self._tokens: Any = None
        self._ends: list[int] = []

    @staticmethod
    def warm_up(counter: TokenCounter) -> None:
        """Import numpy and make one joined call, so the first large batch does not pay for them."""
        job = CountAhead(counter, ["warm", "up"])
        job.encode()

    @property
    def chars(self) -> int:
        return sum(map(len, self._joined)) + sum(map(len, self._alone))

    def encode(self) -> None:
        """Encode the joined texts (any thread)."""
        import numpy as np  # here only: the recorder's large batches are all that need it

        if not self._joined:
            return
        enc = self._counter._enc
        # Any other special token's text is ordinary text here, as in ``TokenCounter.count``.
        tokens = enc.encode_to_numpy(
            _SEPARATOR.join(self._joined), allowed_special={_SEPARATOR}, disallowed_special=()
        )
        self._ends = [*np.flatnonzero(tokens == enc.encode_single_token(_SEPARATOR)).tolist(), len(tokens)]
        self._tokens = tokens

    def known(self, *, ids_over: int) -> KnownCounts:
        """Each text's count after :meth:`encode`, with its ids when over ``ids_over`` tokens."""
        known: KnownCounts = {}
        start = 0
        for text, end in zip(self._joined, self._ends, strict=True):
            n = end - start
            known[text] = (n, self._tokens[start:end].tolist() if ids_over < n <= _KEEP_IDS else None)
            start = end + 1
        for text in self._alone:
            ids = self._counter._enc.encode_ordinary(text)
            known[text] = (len(ids), ids if ids_over < len(ids) <= _KEEP_IDS else None)
        return known


class _Knowing(TokenCounter):
    """``base`` answering from counts made ahead (``CountAhead``); any other text is counted here."""

    def __init__(self, base: TokenCounter, known: KnownCounts) -> None:
        self.name = base.name
        self.method = base.method
        self._enc = base._enc
        self._last = ("", 0, None)
        self._known = known

    def count(self, text: str) -> int:
        hit = self._known.get(text)
        if hit is None:
            return super().count(text)
        # As if just counted: a cut of this text right after (``head_tail``) reuses its ids.
        self._last = (text, hit[0], hit[1])
        return hit[0]


def knowing(base: TokenCounter, known: KnownCounts) -> TokenCounter:
    """``base``, answering the texts of ``known`` without counting them again."""
    return _Knowing(base, known) if known else base


_counters: dict[EncodingName, TokenCounter] = {}


def counter_for(name: EncodingName) -> TokenCounter:
    """The shared counter of an encoding (loaded once per process)."""
    counter = _counters.get(name)
    if counter is None:
        counter = _counters[name] = TokenCounter(name)
    return counter
