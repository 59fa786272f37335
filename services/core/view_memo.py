"""What a thread's view showed last time, kept so the next prepare builds only what changed. Pure.

The ledger is append-only: a record never changes, so the message it shows, the block it forms
(given its place: the run's task, the current turn, an earlier turn) and that block's size are the
same on every prepare until the record's place changes. A memo belongs to one thread's view (the
thread fixes how inherited call ids are tagged) and is kept by the view cache; a prepare without
one builds everything from scratch, through the same code, so both give byte-identical replies.
Assembly right after an append (``--only append``) needs its extension of the last build: without it
the step grows with the thread's length.

Invariants:

1. Entries are keyed by the identity of the records they were built from and hold those records,
   so a key can never name another object (``id`` is unique among live objects): a replaced record
   (trimmed, masked) is a new object and misses.
2. A memoized block is never mutated after it is built: the assembler only ever ``replace``s blocks.
3. The memo holds what the last build used and nothing more (``begin``): entries of records that
   left the view (covered by a summary) or of one-off replacements are dropped at the next build,
   so it is bounded by the view it serves.
4. The blocks of a view are reused whole only for exactly the same records (each the same object,
   in the same order) and the same coverage; extended (``grown_from``) only when the last build's
   records, each the same object, are the first records now.
5. Extending adds entries without dropping the ones whose blocks moved (an extension does not start
   a generation): those stale entries are bounded by the records of the view (``_stale``), and the
   next full build, forced past that bound, drops them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from operator import is_
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from contracts import ChatMessage, ContextBlock, RecordRef

from services.core.records import ascending_by_seq

if TYPE_CHECKING:
    from services.core.records import LedgerRecord

__all__ = ["ViewMemo", "message_of"]

# Bytes a memoized message and a memoized block (with its sizes, sources and wire block) cost beyond
# their text: tracemalloc on a 500-record thread of the bundled samples measured 1.8 MB, which these
# overestimate slightly (2.1 MB), so a cache bounded by them stays under its bound.
_ENTRY_OVERHEAD = 1500
_BLOCK_OVERHEAD = 3000


class _Block(Protocol):
    @property
    def block_id(self) -> str: ...
    @property
    def retention(self) -> object: ...
    @property
    def priority(self) -> int: ...
    @property
    def reason(self) -> str: ...
    @property
    def records(self) -> Sequence[LedgerRecord]: ...
    @property
    def messages(self) -> Sequence[ChatMessage]: ...


_B = TypeVar("_B", bound=_Block)


class _Derived:
    """What was measured and emitted of one memoized block."""

    __slots__ = ("block", "sizes", "refs", "wire_key", "wire", "variants", "outcome_keys", "hashes")

    def __init__(self, block: object) -> None:
        self.block = block
        # Replacements of the block a pure step made last time (deduplication), by what decided them.
        self.variants: dict[object, Any] = {}
        self.outcome_keys: Any = None
        self.sizes: dict[str | None, tuple[int, int]] = {}
        self.refs: tuple[RecordRef, ...] | None = None
        self.wire_key: tuple[int, int, str] | None = None
        self.wire: ContextBlock | None = None
        # The block's protected hash and unit count, by format and place (``services/core/protected.py``).
        self.hashes: dict[tuple[str, bool], tuple[str, int]] = {}


class ViewMemo:
    """Blocks, messages, sizes and wire blocks of one thread's view, reused across prepares."""

    __slots__ = (
        "own_thread",
        "_messages",
        "_messages_before",
        "_blocks",
        "_blocks_before",
        "_derived",
        "_last_records",
        "_last_key",
        "_last_value",
        "_stale",
        "_measured",
        "_message_bytes",
        "bytes",
        "hits",
        "misses",
        "extended",
        "_checked",
        "_checked_ascending",
        "_each",
        "_each_bytes",
    )

    def __init__(self, own_thread: str = "") -> None:
        self.own_thread = own_thread
        # Two generations each: what this build used, and what the previous build used (invariant 3).
        self._messages: dict[tuple[str, int], tuple[LedgerRecord, ChatMessage]] = {}
        self._messages_before: dict[tuple[str, int], tuple[LedgerRecord, ChatMessage]] = {}
        self._blocks: dict[tuple[Any, ...], Any] = {}
        self._blocks_before: dict[tuple[Any, ...], Any] = {}
        self._derived: dict[int, _Derived] = {}
        self._last_records: tuple[LedgerRecord, ...] = ()
        self._last_key: object = None
        self._last_value: object = None
        # Blocks built by extensions since the last full build (invariant 5).
        self._stale = 0
        # Messages measured into ``_message_bytes`` (an extension measures only the ones it added).
        self._measured = 0
        self._message_bytes = 0
        # What the memo adds to the records it was built from, roughly (see ``_ENTRY_OVERHEAD``).
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        # Builds that extended the last one instead of building every block again.
        self.extended = 0
        # The last record list checked for seq order, and the answer (``ascending``).
        self._checked: tuple[LedgerRecord, ...] = ()
        self._checked_ascending = True
        # Per ``each`` key: the records last given and what was made of each; and the text the
        # records made anew hold.
        self._each: dict[object, tuple[tuple[LedgerRecord, ...], tuple[LedgerRecord, ...]]] = {}
        self._each_bytes = 0

    def each(
        self,
        records: Sequence[LedgerRecord],
        key: object,
        make: Callable[[LedgerRecord], LedgerRecord],
    ) -> list[LedgerRecord]:
        """``[make(r) for r in records]``, each record made once while it stays in view; ``key`` names
        what ``make`` does. What ``make`` returns for a record is the same object on every prepare,
        so the blocks built of it are reused as well (context tools rewrote every preview, and
        recounted it, on every prepare). Only what the last call was given is kept (invariant 3).
        """
        last = self._each.get(key)
        if last is not None and _starts_with(records, last[0]):
            # The view grew: only the records added are made, and only their bytes are counted.
            before, made_before = last
            added = list(itertools.islice(records, len(before), None))
            made_added = [make(r) for r in added]
            made = [*made_before, *made_added]
            self._each_bytes += _made_bytes(added, made_added)
        else:
            if last is None:
                made = [make(r) for r in records]
            else:
                # Every record the last call was given is held by it, so an id found is that record.
                by_id = {id(r): m for r, m in zip(*last, strict=True)}
                made = [by_id.get(id(r)) or make(r) for r in records]
                self._each_bytes -= _made_bytes(*last)
            self._each_bytes += _made_bytes(records, made)
        self._each[key] = tuple(records), tuple(made)
        return made

    def ascending(self, records: Sequence[LedgerRecord]) -> bool:
        """Whether ``records`` ascend by seq: walked once per list, and for a list that extends the
        last one checked (each record the same object) only from where that one ended (a 5,000-record
        view's walk is 7 % of its prepare)."""
        last = self._checked
        n = len(last)
        if n and _starts_with(records, last):
            found = self._checked_ascending and ascending_by_seq(itertools.islice(records, n - 1, None))
        else:
            found = ascending_by_seq(records)
        # A copy, as ``keep_build`` keeps one: a caller's list changed in place later cannot fool it.
        self._checked, self._checked_ascending = tuple(records), found
        return found

    def last_build(self, records: Sequence[LedgerRecord], key: object) -> Any:
        """The blocks built last time, if ``records`` and ``key`` are exactly those (invariant 4)."""
        last = self._last_records
        if self._last_value is not None and key == self._last_key and _same_records(records, last):
            self.hits += 1
            return self._last_value
        return None

    def grown_from(self, records: Sequence[LedgerRecord], key: object) -> tuple[int, Any] | None:
        """``(n, blocks)`` of the last build, if its records are the first ``n < len(records)`` of
        ``records`` and ``key`` is its key (invariant 4), and extensions have not yet built as many
        blocks as the view holds records (invariant 5)."""
        last = self._last_records
        n = len(last)
        if (
            self._last_value is None
            or key != self._last_key
            or not n < len(records)
            or self._stale > max(64, len(records))
            or not all(map(is_, last, records))
        ):
            return None
        return n, self._last_value

    def keep_extension(
        self, records: Sequence[LedgerRecord], key: object, value: object, *, built: int
    ) -> None:
        """Remember an extension's blocks; nothing is dropped until the next full build (invariant 5)."""
        self._last_records, self._last_key, self._last_value = tuple(records), key, value
        self._stale += built
        self.extended += 1
        # Entries are only added since the last measure, at the end of the dict: measure those.
        self._message_bytes += _bytes_of(itertools.islice(self._messages.values(), self._measured, None))
        self._measure(len(records))

    def keep_build(self, records: Sequence[LedgerRecord], key: object, value: object) -> None:
        """Remember a build's blocks; what the build did not use is dropped (invariant 3)."""
        self._last_records, self._last_key, self._last_value = tuple(records), key, value
        self._messages_before = {}
        self._blocks_before = {}
        self._stale = 0
        self._message_bytes = sum(
            _ENTRY_OVERHEAD + 2 * len(m.content or "") for _, m in self._messages.values()
        )
        self._measure(len(records))

    def _measure(self, records: int) -> None:
        self._measured = len(self._messages)
        self.bytes = (
            self._message_bytes + _BLOCK_OVERHEAD * len(self._blocks) + 8 * records + self._each_bytes
        )

    def begin(self) -> None:
        """Start a build: the previous build's entries become the older generation."""
        self._messages_before, self._messages = self._messages, {}
        self._blocks_before, self._blocks = self._blocks, {}

    def message(self, record: LedgerRecord, kind: str, build: Callable[[], ChatMessage]) -> ChatMessage:
        """What ``build()`` made of ``record`` as ``kind`` last time, or its result now."""
        key = (kind, id(record))
        found = self._messages.get(key) or self._messages_before.get(key)
        if found is None or found[0] is not record:
            self.misses += 1
            found = (record, build())
        self._messages[key] = found
        return found[1]

    def intern(self, block: _B) -> _B:
        """The block built last time from the same records in the same place, or ``block`` itself.

        A block is what its records and its place make of them (invariant 1): equal keys mean equal
        blocks, so the older one is kept and everything measured and emitted of it is reused.
        """
        records = block.records
        key = (block.block_id, block.retention, block.priority, block.reason, *map(id, records))
        found = self._blocks.get(key) or self._blocks_before.get(key)
        if found is None or not all(map(is_, found.records, records)):
            found = block
        self._blocks[key] = found
        derived = self._derived.get(id(found))
        if derived is None or derived.block is not found:
            self._derived[id(found)] = _Derived(found)
        return found  # type: ignore[return-value]

    def intern_fixed(self, block: _B) -> _B:
        """A block made of no records (the summary, the state, a handoff or note): the one built last
        time with the same messages in the same place, or ``block`` itself.

        Such a block is what its messages make of it, so equal messages mean equal blocks and its
        size, wire block and protected hash are measured once, not a compacted thread's ~100 KB
        summary block hashed on every prepare. The summary's text is the same object on every
        prepare (the store keeps its row), so the key costs no walk of it.
        """
        key = ("fixed", block.block_id, block.retention, block.priority, block.reason, *block.messages)
        found = self._blocks.get(key) or self._blocks_before.get(key)
        if found is None:
            found = block
        self._blocks[key] = found
        if self.derived(found) is None:
            self._derived[id(found)] = _Derived(found)
        return found

    def adopt(self, block: object) -> None:
        """Measure and emit ``block`` (a memoized replacement of a memoized block) only once too."""
        if self.derived(block) is None:
            self._derived[id(block)] = _Derived(block)

    def settle(self, kept: Sequence[object]) -> None:
        """Forget what was measured of blocks the last build no longer holds (and their variants)."""
        ids = {id(b) for b in kept}
        for i in list(ids):
            found = self._derived.get(i)
            if found is not None:
                ids.update(id(v.block) for v in found.variants.values())
        self._derived = {i: d for i, d in self._derived.items() if i in ids}

    def derived(self, block: object) -> _Derived | None:
        """What was measured of a memoized block, or None for any other block."""
        found = self._derived.get(id(block))
        return found if found is not None and found.block is block else None

    def estimate_bytes(self) -> int:
        """What the memo adds to its view's records, roughly (text counted, objects by overhead)."""
        return self.bytes


def _made_bytes(records: Sequence[LedgerRecord], made: Sequence[LedgerRecord]) -> int:
    """The text of the records ``each`` made anew (a record returned as it was costs nothing more)."""
    return sum(
        _ENTRY_OVERHEAD + 2 * (len(m.text) + len(m.mask_text or ""))
        for r, m in zip(records, made, strict=True)
        if m is not r
    )


def _same_records(records: Sequence[LedgerRecord], kept: Sequence[LedgerRecord]) -> bool:
    """Whether ``records`` are ``kept``, each the same object in the same place."""
    return len(records) == len(kept) and all(map(is_, records, kept))


def _starts_with(records: Sequence[LedgerRecord], first: Sequence[LedgerRecord]) -> bool:
    """Whether ``records`` begin with ``first``, each the same object."""
    return len(first) <= len(records) and all(map(is_, first, records))


def _bytes_of(entries: Iterable[tuple[LedgerRecord, ChatMessage]]) -> int:
    return sum(_ENTRY_OVERHEAD + 2 * len(m.content or "") for _, m in entries)


def message_of(
    memo: ViewMemo | None, record: LedgerRecord, kind: str, build: Callable[[], ChatMessage]
) -> ChatMessage:
    """``build()`` memoized in ``memo`` when there is one."""
    return build() if memo is None else memo.message(record, kind, build)
