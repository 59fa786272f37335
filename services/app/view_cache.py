"""One cache of thread views per process, bounded by bytes.

The assembler, budgeter and compactor of a process read the same hot threads through one
``ViewLoader``; this is what it keeps: each thread's records up to the head last read, the blocks its
last assembly built and the contexts last assembled of each view (``assemble_reusing``), and the
immutable inherited snapshots of runs. Entries are
evicted least recently used first once their estimated bytes exceed the bound, so memory follows a
setting (``CTX_VIEW_CACHE_MB``) rather than a count of threads whatever their size.

An entry is only ever a prefix of an append-only ledger: the loader reads what is new past it and
serves exactly the head it was asked for, so an entry can be old but never wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from contracts import PreparedContext, PrepareRequest
from contracts.windows import WindowPolicy

from services.core.assemble import Assembly, OverBudgetView, ThreadSnapshot, assemble_context, assemble_view
from services.core.budget import BudgetSpec
from services.core.groups import BlockSet
from services.core.history_depth import first_depth
from services.core.tokens import TokenCounter

if TYPE_CHECKING:
    from services.core.records import LedgerRecord

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "CachedRecords",
    "ViewCache",
    "assemble_reusing",
    "first_depth_reusing",
    "last_blocks",
    "record_bytes",
]

# What a cached record costs beyond its text: the object, its parsed body, payload and token counts
# (tracemalloc on the bundled samples: 2.2 KB per record at 560 characters of text on average).
_RECORD_OVERHEAD = 1000
# The default bound: a 5,000-record thread of the bundled samples takes about 11 MB (2.2 KB a record).
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024
# A kept context shares its messages' text with the records: what it adds is its messages, blocks,
# reports and manifest, estimated per message and block.
_CONTEXT_OVERHEAD = 4000
_CONTEXT_PART_OVERHEAD = 400
# What a thread's last assembly adds to its cached records (which its blocks share): per block, its
# messages and derived sizes (tracemalloc on the append benchmark's thread: about 4 KB a block),
# and its context.
_BLOCK_BYTES = 4000
# Contexts kept per thread: a runtime may alternate a few requests (purposes, formats) on one view.
_CONTEXTS = 4


def record_bytes(records: Sequence[LedgerRecord]) -> int:
    """An estimate of what ``records`` hold in memory (text twice: in the record and its payload)."""
    return sum(_RECORD_OVERHEAD + 2 * (len(r.text) + len(r.mask_text or "")) for r in records)


@dataclass
class CachedRecords:
    """A thread's records up to ``last_seq``."""

    last_seq: int
    records: list[LedgerRecord]
    record_bytes: int = 0
    # Exports resolved to their parent records, by seq: resolving reads the parent again.
    resolved: dict[int, LedgerRecord] = field(default_factory=dict)
    # Where in ``records`` the exports still to resolve are, found as records arrive: a load then
    # visits those, not every record of the thread (1.6 ms of a 5,000-record prepare).
    exports: tuple[int, ...] = ()


class ViewCache:
    """Least-recently-used entries by estimated bytes, with the counts the metrics export."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> object | None:
        """The entry under ``key`` (now the most recently used), or None."""
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: Hashable, value: object, size: int) -> list[Hashable]:
        """Keep ``value`` under ``key`` at ``size`` bytes; returns the keys evicted to make room.

        An entry larger than the whole bound is not kept (it would evict everything else and itself).
        """
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        evicted: list[Hashable] = []
        if size > self.max_bytes:
            return evicted
        self._entries[key] = (value, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            gone, (_, gone_size) = self._entries.popitem(last=False)
            self.bytes -= gone_size
            self.evictions += 1
            evicted.append(gone)
        return evicted

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        return list(self._entries)


def assemble_reusing(
    cache: ViewCache,
    snapshot: ThreadSnapshot,
    request: PrepareRequest,
    budget: BudgetSpec,
    counter: TokenCounter | None,
    *,
    compaction_wait_ms: int = 0,
    allow_drop_history: bool = False,
    window_policy: WindowPolicy | None = None,
) -> PreparedContext | OverBudgetView:
    """``assemble_context``, answered from ``cache`` for a prepare that neither waited nor drops
    history when the thread's view did not change since: assembly is a pure function of its inputs,
    and the snapshot without its records (head revision, view revision, window, summary, evidence,
    hook changes) names the records a loaded view holds. Compared, never hashed: a request's tools
    hold JSON schemas."""
    if compaction_wait_ms or allow_drop_history:
        return assemble_context(
            snapshot,
            request,
            budget,
            counter,
            compaction_wait_ms=compaction_wait_ms,
            allow_drop_history=allow_drop_history,
            window_policy=window_policy,
        )
    inputs = (replace(snapshot, records=()), request, budget, counter, window_policy)
    key = ("contexts", snapshot.own_thread)
    found = cache.get(key)
    kept: tuple[_Kept, ...] = found if isinstance(found, tuple) else ()
    for k in kept:
        if k.inputs == inputs:
            return k.context
    prepared = _assemble_extending(cache, snapshot, request, budget, counter, window_policy)
    if isinstance(prepared, PreparedContext):
        # Only contexts of this head and view revision stay: the thread's older ones answer no prepare.
        at = snapshot.revision, snapshot.view_revision
        kept = (_Kept(inputs, prepared, at), *(k for k in kept if k.at == at))[:_CONTEXTS]
        parts = sum(len(k.context.messages) + len(k.context.blocks) for k in kept)
        cache.put(key, kept, _CONTEXT_OVERHEAD * len(kept) + _CONTEXT_PART_OVERHEAD * parts)
    return prepared


def first_depth_reusing(
    cache: ViewCache,
    snapshot: ThreadSnapshot,
    depths: Sequence[ThreadSnapshot],
    budget: BudgetSpec,
    made_for: int,
) -> int:
    """``first_depth``, answered from ``cache`` while the thread's head and view revision stand: the
    depths hold the records of that head and the summaries of that view. Counting every record at
    each depth is the step that grows with the thread (``--only pure``, compacted 5,000 records at
    gpt-4o: 15 ms in-process without this)."""
    if budget.input_budget <= made_for:
        return len(depths) - 1
    inputs = (
        snapshot.revision,
        snapshot.view_revision,
        len(depths),
        budget.input_budget,
        budget.encoding,
        made_for,
    )
    key = ("depth", snapshot.own_thread)
    found = cache.get(key)
    kept: tuple[tuple[tuple[object, ...], int], ...] = found if isinstance(found, tuple) else ()
    for k, first in kept:
        if k == inputs:
            return first
    first = first_depth(depths, budget.input_budget, budget.encoding, made_for=made_for)
    kept = ((inputs, first), *(k for k in kept if k[0][:2] == inputs[:2]))[:_CONTEXTS]
    cache.put(key, kept, 200 * len(kept))
    return first


def last_blocks(cache: ViewCache, thread_id: str, *, summarized: bool) -> BlockSet | None:
    """The blocks the thread's last assembly built of its records as recorded (previews not
    rewritten for context tools), with or without its committed summary, if the cache still holds
    them: a build of the same view extends them."""
    found = cache.get(_assembly_key(thread_id, context_tools=False, summarized=summarized))
    return found.blocks if isinstance(found, Assembly) else None


def _assembly_key(thread_id: str, *, context_tools: bool, summarized: bool) -> tuple[str, str, bool, bool]:
    # Prepares of different budgets may show one thread at both depths (services/core/history_depth.py):
    # each depth extends its own last build.
    return ("assembly", thread_id, context_tools, summarized)


def _assemble_extending(
    cache: ViewCache,
    snapshot: ThreadSnapshot,
    request: PrepareRequest,
    budget: BudgetSpec,
    counter: TokenCounter | None,
    window_policy: WindowPolicy | None,
) -> PreparedContext | OverBudgetView:
    """``assemble_context``, given this thread's last assembly: after an append only the blocks the new
    records change are built (``build_view_blocks``) and only the wire blocks that changed are made
    (``_emit``), where making them all again grows the step after an append with the thread
    (``--only append``). Kept per thread and whether previews name the read tool (which rewrites the
    records the blocks are built from); assembly checks the rest by value: the same first records,
    coverage and thread for the blocks, every field for a wire block."""
    key = _assembly_key(
        snapshot.own_thread, context_tools=request.context_tools, summarized=snapshot.summary is not None
    )
    found = cache.get(key)
    previous = found if isinstance(found, Assembly) else None
    assembly = assemble_view(
        snapshot, request, budget, counter, window_policy=window_policy, previous=previous
    )
    blocks, context = assembly.blocks, assembly.context
    parts = len(context.messages) + len(context.blocks) if isinstance(context, PreparedContext) else 0
    size = _BLOCK_BYTES * (len(blocks.ready) + len(blocks.covered)) + _CONTEXT_PART_OVERHEAD * parts
    cache.put(key, assembly, _CONTEXT_OVERHEAD + size)
    return context


@dataclass(frozen=True)
class _Kept:
    """A context, what it was assembled from, and the head and view revision it is of."""

    inputs: tuple[object, ...]
    context: PreparedContext
    at: tuple[int, int]
