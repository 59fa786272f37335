"""Money per task: each model call of a trace priced with the provider's prompt cache simulated. Pure.

A call is the context a system sends at one prepare point, as segments the cache can match: the
tools array (when there is one), then each message, each with its tokens by the eval's one count.
The cache matches whole segments, so a message that changed by one character is a miss from there
on — a lower bound on what the provider's token-level match would reuse inside that message.

The rules simulated, after each provider's published prompt-caching documentation:

1. **OpenAI (automatic prefix caching).** Every prompt is cached as it is sent. A later call reads
   the longest prefix it shares with an earlier call still in the cache, if that prefix is at least
   ``min_cached_tokens`` (1,024) long, rounded down to ``1,024 + k × 128`` tokens (hits come in
   128-token increments). A prefix is dropped after ``cache_ttl_s`` without a call that sends it
   (the documentation says 5–10 minutes of inactivity; the table says 5).
2. **Anthropic (explicit breakpoints).** Only prefixes that end at a breakpoint (``cache_control``)
   are written, and only when at least ``min_cached_tokens`` long. A call reads the longest written
   prefix, not expired, that ends at or before its last breakpoint; the tokens from there to its
   last breakpoint are written at ``cache_write`` (the premium: 1.25× input for the 5-minute TTL,
   2× for the 1-hour one). A read or write restarts the entry's TTL. The API's look-back limit
   (20 blocks before a breakpoint) is not simulated: a context that grows by more than 20 blocks
   between two calls reads more here than it would there.
3. Input after the cached and written tokens, and the reply priming, is billed at ``input``; the
   reply at ``output``.
4. A summarizer call (``bill_summarizer``) is billed at ``input`` for what it is sent and ``output``
   for the summary: its prompt is new every time, so no cache is simulated for it.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, assert_never

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from contracts.exceptions import InvalidConfiguration
from services.core.trace import TraceLine

from services.core.evaluation.fair_count import REPLY_PRIMING, ContextCounter, count_tools, message_key

__all__ = [
    "BUILTIN_PRICES",
    "DEFAULT_PRICED",
    "DEFAULT_STEP_S",
    "Bill",
    "Call",
    "Price",
    "Provider",
    "bill_calls",
    "bill_summarizer",
    "call_of",
    "cached_floor_ratio",
    "call_times",
    "floor_ratio",
    "price_table",
    "with_pauses",
]

Provider = Literal["openai", "anthropic"]

# Think time between two calls when the trace has no timestamps: a model reply plus a tool run.
DEFAULT_STEP_S = 20.0
_PER = 1_000_000


class Price(BaseModel):
    """USD per million tokens of one model profile, and how its provider's prompt cache behaves."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: Provider
    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    output: float = Field(ge=0)
    # What a cache write costs per million tokens (Anthropic); OpenAI's writes cost plain input.
    cache_write: float = Field(default=0.0, ge=0)
    cache_ttl_s: float = Field(default=300.0, gt=0)
    min_cached_tokens: int = Field(default=1024, ge=0)


# List prices, sourced and dated in docs/eval.md. Anthropic at the 5-minute TTL (writes 1.25× input).
BUILTIN_PRICES: Mapping[str, Price] = {
    "gpt-4o": Price(provider="openai", input=2.50, cached_input=1.25, output=10.00),
    "gpt-4o-mini": Price(provider="openai", input=0.15, cached_input=0.075, output=0.60),
    "gpt-4.1": Price(provider="openai", input=2.00, cached_input=0.50, output=8.00),
    "claude-sonnet-4": Price(
        provider="anthropic", input=3.00, cached_input=0.30, output=15.00, cache_write=3.75
    ),
    "claude-opus-4": Price(
        provider="anthropic", input=15.00, cached_input=1.50, output=75.00, cache_write=18.75
    ),
}

# What ``ctxfleet eval`` prices unless told: one profile per provider's cache behaviour.
DEFAULT_PRICED: tuple[str, ...] = ("gpt-4.1", "claude-sonnet-4")


def price_table(overrides: Mapping[str, JsonValue] | None = None) -> dict[str, Price]:
    """The built-in table with ``overrides`` (profile → price fields) laid over it.

    A profile the table knows takes the given fields over its own; a new profile needs them all.

    Raises:
        InvalidConfiguration: one problem per bad field or entry.
    """
    table = dict(BUILTIN_PRICES)
    problems: list[str] = []
    for name, entry in (overrides or {}).items():
        if not isinstance(entry, dict):
            problems.append(f"prices.{name}: expected an object of price fields")
            continue
        base = table[name].model_dump() if name in table else {}
        try:
            table[name] = Price.model_validate({**base, **entry})
        except ValidationError as exc:
            for error in exc.errors():
                where = ".".join(str(p) for p in error["loc"])
                problems.append(f"prices.{name}.{where}: {error['msg']}")
    if problems:
        raise InvalidConfiguration(problems)
    return table


@dataclass(frozen=True, slots=True)
class Call:
    """One model call as the cache sees it: segment keys and tokens, breakpoints, time and reply."""

    keys: tuple[Hashable, ...]
    tokens: tuple[int, ...]
    at_s: float
    output_tokens: int
    # Segment counts at which a prefix ends in a cache breakpoint (Anthropic).
    breakpoints: tuple[int, ...] = ()
    # Sent after every segment and never cached (the reply priming).
    tail_tokens: int = 0


@dataclass(slots=True)
class Bill:
    """What some calls cost: tokens by how they were billed, and the dollars."""

    calls: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    written_tokens: int = 0
    output_tokens: int = 0
    usd: float = 0.0
    # The fleet's own summarizer calls, included in ``usd``.
    summarizer_calls: int = 0
    summarizer_input_tokens: int = 0
    summarizer_output_tokens: int = 0
    summarizer_usd: float = 0.0

    @property
    def hit_share(self) -> float | None:
        """The share of input tokens read from the cache."""
        return self.cached_tokens / self.input_tokens if self.input_tokens else None

    def merge(self, other: Bill) -> None:
        """Add ``other`` into this bill."""
        self.calls += other.calls
        self.input_tokens += other.input_tokens
        self.cached_tokens += other.cached_tokens
        self.written_tokens += other.written_tokens
        self.output_tokens += other.output_tokens
        self.usd += other.usd
        self.summarizer_calls += other.summarizer_calls
        self.summarizer_input_tokens += other.summarizer_input_tokens
        self.summarizer_output_tokens += other.summarizer_output_tokens
        self.summarizer_usd += other.summarizer_usd

    def as_json(self, tasks: int) -> dict[str, JsonValue]:
        """The bill as JSON, with its cost per task over ``tasks``."""
        return {
            "usd": round(self.usd, 6),
            "usd_per_task": round(self.usd / tasks, 6) if tasks else None,
            "cache_hit_share": None if self.hit_share is None else round(self.hit_share, 4),
            "calls": self.calls,
            "input_tokens": self.input_tokens,
            "cached_tokens": self.cached_tokens,
            "written_tokens": self.written_tokens,
            "output_tokens": self.output_tokens,
            "summarizer": {
                "calls": self.summarizer_calls,
                "input_tokens": self.summarizer_input_tokens,
                "output_tokens": self.summarizer_output_tokens,
                "usd": round(self.summarizer_usd, 6),
            },
        }


@dataclass(slots=True)
class _Node:
    """One segment deep into the cache: when the prefix ending here was last sent or written."""

    children: dict[Hashable, _Node] = field(default_factory=dict)
    # OpenAI: the last call that sent this prefix. Anthropic: the last write or read of an entry here.
    touched_s: float | None = None


def bill_calls(calls: Sequence[Call], price: Price) -> Bill:
    """Price ``calls`` (in order, one thread) with ``price``'s provider cache simulated."""
    root = _Node()
    bill = Bill()
    for call in calls:
        match price.provider:
            case "openai":
                cached, written = _openai(root, call, price)
            case "anthropic":
                cached, written = _anthropic(root, call, price)
            case _:
                assert_never(price.provider)
        total = sum(call.tokens) + call.tail_tokens
        plain = total - cached - written
        bill.calls += 1
        bill.input_tokens += total
        bill.cached_tokens += cached
        bill.written_tokens += written
        bill.output_tokens += call.output_tokens
        bill.usd += (
            plain * price.input
            + cached * price.cached_input
            + written * price.cache_write
            + call.output_tokens * price.output
        ) / _PER
    return bill


def bill_summarizer(bill: Bill, input_tokens: int, output_tokens: int, price: Price) -> None:
    """Add one summarizer call, sent ``input_tokens`` and answering ``output_tokens``, to ``bill``."""
    usd = (input_tokens * price.input + output_tokens * price.output) / _PER
    bill.summarizer_calls += 1
    bill.summarizer_input_tokens += input_tokens
    bill.summarizer_output_tokens += output_tokens
    bill.summarizer_usd += usd
    bill.usd += usd


def floor_ratio(bill: Bill, baseline: Bill, price: Price) -> float | None:
    """The lowest cost ratio to ``baseline`` a system billed ``bill`` at ``price`` could reach: its
    replies alone, as if every token it sent were free (the replies are the trace's, the same for
    every system). ``None`` when the baseline cost nothing."""
    return bill.output_tokens * price.output / _PER / baseline.usd if baseline.usd else None


def cached_floor_ratio(bill: Bill, baseline: Bill, price: Price) -> float | None:
    """The lowest cost ratio to ``baseline`` a system billed ``bill`` could reach sending the same
    tokens: its replies, every input token a cache read, and no summarizer call."""
    if not baseline.usd:
        return None
    return (bill.output_tokens * price.output + bill.input_tokens * price.cached_input) / _PER / baseline.usd


def _openai(root: _Node, call: Call, price: Price) -> tuple[int, int]:
    """(cached, written) tokens of ``call``; every prefix it sends stays cached from now on."""
    node, shared, live = root, 0, True
    for key, tokens in zip(call.keys, call.tokens, strict=True):
        child = node.children.get(key)
        if child is None:
            child = node.children[key] = _Node()
            live = False
        elif live and not _fresh(child, call.at_s, price):
            live = False
        if live:
            shared += tokens
        child.touched_s = call.at_s
        node = child
    if shared < price.min_cached_tokens:
        return 0, 0
    increments = (shared - price.min_cached_tokens) // 128
    return price.min_cached_tokens + 128 * increments, 0


def _anthropic(root: _Node, call: Call, price: Price) -> tuple[int, int]:
    """(cached, written) tokens of ``call``; entries are read, then written at its breakpoints."""
    last = max(call.breakpoints, default=0)
    node, depth, prefix, read = root, 0, 0, 0
    hit: _Node | None = None
    path: dict[int, tuple[_Node, int]] = {}
    for key, tokens in zip(call.keys[:last], call.tokens[:last], strict=True):
        child = node.children.get(key)
        if child is None:
            child = node.children[key] = _Node()
        node, depth, prefix = child, depth + 1, prefix + tokens
        path[depth] = (node, prefix)
        if _fresh(node, call.at_s, price):
            hit, read = node, prefix
    if hit is not None:
        hit.touched_s = call.at_s
    written = 0
    for depth in call.breakpoints:
        entry, tokens = path[depth]
        if tokens >= price.min_cached_tokens:
            entry.touched_s = call.at_s
            written = max(written, tokens - read)
    return read, written


def _fresh(node: _Node, at_s: float, price: Price) -> bool:
    return node.touched_s is not None and at_s - node.touched_s <= price.cache_ttl_s


def call_of(
    messages: Sequence[Mapping[str, JsonValue]],
    tools: Sequence[Mapping[str, JsonValue]],
    counter: ContextCounter,
    *,
    at_s: float,
    output_tokens: int,
    breakpoints: Sequence[int] = (),
) -> Call:
    """The call that sends ``messages`` with ``tools``; ``breakpoints`` are counts of leading messages."""
    keys: list[Hashable] = []
    tokens: list[int] = []
    if tools:
        keys.append(("tools", json.dumps(list(tools), sort_keys=True)))
        tokens.append(count_tools(tools, counter.counter))
    # The tools come first in the provider's prefix, so a message breakpoint lies one segment later.
    shift = len(keys)
    for message in messages:
        keys.append(message_key(message))
        tokens.append(counter.message(message))
    marks = sorted({shift + n for n in breakpoints if 0 < n <= len(messages)} | ({shift} if shift else set()))
    return Call(tuple(keys), tuple(tokens), at_s, output_tokens, tuple(marks), REPLY_PRIMING)


def call_times(
    lines: Sequence[TraceLine], points: Sequence[int], *, step_s: float = DEFAULT_STEP_S
) -> list[float]:
    """Seconds from the first call to each call at ``points`` (indexes of the lines it precedes).

    A call is sent when the event before it was recorded: that line's ``ts``. Where the trace has
    no usable ``ts`` the call comes ``step_s`` after the one before.
    """
    times: list[float] = []
    first: datetime | None = None
    for index in points:
        stamp = _stamp(lines[index - 1].ts) if index > 0 else None
        first = first or stamp
        if stamp is not None and first is not None:
            at = (stamp - first).total_seconds()
            # A clock that steps back never makes a call earlier than the one before it.
            times.append(max(at, times[-1]) if times else at)
        else:
            times.append(times[-1] + step_s if times else 0.0)
    return times


def with_pauses(times: Sequence[float], every: int, pause_s: float) -> list[float]:
    """``times`` with a pause of ``pause_s`` before every ``every``-th call (a person away from a run):
    each pause delays that call and every later one. ``every`` 0 pauses nowhere."""
    if every <= 0 or pause_s <= 0:
        return list(times)
    return [at + pause_s * ((ordinal + 1) // every) for ordinal, at in enumerate(times)]


def _stamp(ts: str | None) -> datetime | None:
    if ts is None:
        return None
    try:
        stamp = datetime.fromisoformat(ts)
    except ValueError:
        return None
    # A stamp without a zone is read as UTC, so stamps with and without one can be compared.
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
