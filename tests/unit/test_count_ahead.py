"""A large batch's texts are counted ahead, in one tiktoken call on the counting thread:
every count and every cut is the one counting each text alone gives, and so is every record."""

from __future__ import annotations

import threading

import pytest

from contracts import Event
from services.app.recording import RecordingService
from services.core.ledger import LedgerReads, RecordingLimits, decode_batch, plan_batch, texts_to_count
from services.core.tokens import CountAhead, TokenCounter, counter_for, knowing
from services.store.memory import MemoryStore
from tests.fixtures.builders import incoming, sample_trace_events

pytestmark = pytest.mark.anyio

LIMITS = RecordingLimits()
# Ends and joins where a tokenizer's pieces could run across a boundary, the separator itself and
# another special token's text.
EDGES = [
    " ",
    "\n",
    "  trailing spaces   ",
    "x\n ",
    "\n\nleading newlines",
    "ünïcödé — 漢字 🙂",
    "ends with a partial <|endoftext|",
    "holds <|endoftext|> in the middle",
    "<|endoftext|>",
    "<|endofprompt|> is ordinary text too",
    "'s",
    "123456789",
]


def _sample_texts() -> list[str]:
    return texts_to_count(decode_batch(incoming(sample_trace_events("s-texts")), LIMITS))


def test_texts_counted_ahead_in_one_call_count_as_each_counted_alone() -> None:
    texts = [*_sample_texts(), *EDGES, *EDGES, ""]
    assert sum(map(len, texts)) > 100_000
    job = CountAhead(counter_for("o200k_base"), texts)
    job.encode()
    known = job.known(ids_over=500)

    alone = TokenCounter("o200k_base")
    assert set(known) == {t for t in texts if t}
    for text, (n, ids) in known.items():
        assert n == alone.count(text), text[:80]
        if 500 < n:
            assert ids == alone._enc.encode_ordinary(text)
        else:
            assert ids is None


class _Encodes:
    """The encoding of ``counter``, counting how often it encodes a whole text."""

    def __init__(self, counter: TokenCounter) -> None:
        self._inner = counter._enc
        self.encodes = 0
        counter._enc = self  # type: ignore[assignment]

    def encode_ordinary(self, text: str) -> list[int]:
        self.encodes += 1
        return self._inner.encode_ordinary(text)

    def decode(self, ids: list[int]) -> str:
        return self._inner.decode(ids)


def test_a_cut_of_a_text_counted_ahead_reuses_its_ids() -> None:
    text = " ".join(f"line {i} of the build log" for i in range(2000))
    job = CountAhead(counter_for("o200k_base"), [text])
    job.encode()
    counter = knowing(TokenCounter("o200k_base"), job.known(ids_over=100))
    encoding = _Encodes(counter)
    fresh = TokenCounter("o200k_base")
    assert counter.count(text) == fresh.count(text)
    assert counter.head_tail(text, head_tokens=300, tail_tokens=200) == fresh.head_tail(
        text, head_tokens=300, tail_tokens=200
    )
    assert encoding.encodes == 0
    # A text it was not told of is counted as before.
    assert counter.count("another text") == fresh.count("another text") and encoding.encodes == 1


def _plan_view(counters: dict) -> list[tuple[object, ...]]:  # type: ignore[type-arg]
    decoded = decode_batch(incoming(sample_trace_events("s-plan")), LIMITS)
    plan = plan_batch(decoded, LedgerReads({}, {}, {}), LIMITS, counters)
    return [
        (
            r.event_key,
            r.tokens.o200k_base,
            r.view_text,
            r.text,
            r.blob_sha256,
            r.mask_text,
            r.mask_tokens.o200k_base if r.mask_tokens else None,
        )
        for r in plan.records
    ]


def test_a_plan_with_counts_made_ahead_is_the_plan_counting_as_it_goes() -> None:
    base = counter_for("o200k_base")
    decoded = decode_batch(incoming(sample_trace_events("s-plan")), LIMITS)
    job = CountAhead(base, texts_to_count(decoded))
    job.encode()
    counter = knowing(base, job.known(ids_over=LIMITS.tool_result_max_tokens))
    encoding = _Encodes(counter)
    ahead = _plan_view({"o200k_base": counter})
    assert ahead == _plan_view({"o200k_base": TokenCounter("o200k_base")})
    cut = sum(1 for _, _, view_text, *_ in ahead if view_text is not None)
    masked = sum(1 for *_, mask_text, _ in ahead if mask_text is not None)
    assert cut > 0 and masked > 0, "the samples have outputs to cut and to mask"
    # Left to the plan: a cut output's new text and the preview of a long one, nothing else.
    assert encoding.encodes <= cut + masked


class _Sink:
    async def publish(self, letter: object, msg_id: str) -> None:
        raise AssertionError(f"no event of the samples is rejected: {letter}")


async def _recorded(events: list[Event], batch: int) -> list[tuple[str, int, str | None]]:
    store = MemoryStore()
    service = RecordingService(store, _Sink(), limits=LIMITS, recorder_id="unit")  # type: ignore[arg-type]
    msgs = incoming(events)
    for i in range(0, len(msgs), batch):
        await service.record_batch(0, msgs[i : i + batch])
    out = []
    async with store.connection() as s:
        for thread_id in dict.fromkeys(e.thread_id for e in events):
            head = await s.select_head(thread_id)
            assert head is not None
            for r in await s.select_records(thread_id, gt=0, lte=head.last_seq):
                out.append((r.event_key, r.tokens.o200k_base, r.mask_text))
    return out


async def test_a_large_batch_is_counted_on_the_counting_thread_and_records_what_one_event_batches_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = sample_trace_events("s-batch")
    threads: list[str] = []
    encode = CountAhead.encode

    def spied(self: CountAhead) -> None:
        if self.chars >= 16_384:  # not the service's warm-up
            threads.append(threading.current_thread().name)
        encode(self)

    monkeypatch.setattr(CountAhead, "encode", spied)
    one_by_one = await _recorded(events, 1)
    # An agent's step is counted in its plan, on the loop, unless its own text is that long.
    long_ones = [
        e for e in events if sum(map(len, texts_to_count(decode_batch(incoming([e]), LIMITS)))) >= 16_384
    ]
    assert 0 < len(threads) == len(long_ones) < len(events) // 10
    threads.clear()
    whole = await _recorded(events, len(events))
    assert len(threads) == 1 and threads[0].startswith("ctx-count")
    assert whole == one_by_one and len(whole) == len(events)


async def test_a_count_ahead_that_fails_leaves_the_plan_to_count_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    events = sample_trace_events("s-broken")
    expected = await _recorded(events, len(events))

    def broken(self: CountAhead) -> None:
        if self.chars >= 16_384:  # not the service's warm-up
            raise RuntimeError("tokenizer changed its mind")

    monkeypatch.setattr(CountAhead, "encode", broken)
    # _Sink raises on any dead letter: every event is recorded, with the counts of the plan's own.
    assert await _recorded(events, len(events)) == expected
    assert "counting a batch ahead failed (RuntimeError" in caplog.text
