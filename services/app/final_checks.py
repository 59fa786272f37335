"""The gateway's final check as a use case: know each prepared context by id, check what is sent.

Keeping what a check needs never slows a prepare: the assembler hands its reply to :meth:`remember`,
which only puts the (already built) reply's JSON into a bounded in-process cache and queues the
``PreparedContext`` for the write-behind. One flusher per process derives each queued context's
record (the manifest, a digest per unit, the budget figures — never content) and stores the batch under
``(prepared_id, format)`` in one statement, skipping a context it already stored (an unchanged view
prepared again has the same id); beside it, the thread's served history (each block's manifest
entry, and the texts of blocks this process has not stored for the thread yet). A check served by
the process that prepared finds the context in the cache; any other replica reads the record, and
waits a moment for one still being written before it answers ``prepared_context_not_found``.

Nothing answered is dropped later. Invariants of the write-behind:

1. A record is pending from :meth:`GatewayService.remember` until it is stored; the store being
   unavailable (``StoreUnavailable``) keeps it pending, and the batch is tried again after a backoff
   (0.1 s doubling to 5 s), for as long as the outage lasts.
2. A record the store refuses for what it holds (any other error) is the only one dropped: a refused
   batch is stored one record at a time, so the others are kept; each refused record is counted and
   logged once.
3. Pending records are bounded (``max_pending_records`` and ``max_pending_bytes``). At the bound a
   prepare is answered ``overloaded`` (retryable, with a hint) instead of being answered ``ok`` with a
   record that might never be stored: a runtime's retry after the outage gets a recorded context,
   where dropping the oldest pending records would break a promise already made to another caller.
4. :meth:`GatewayService.close` (shutdown) retries what is pending within its bound; what is still
   pending after it is counted and logged as dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from itertools import islice

from contracts import FinalCheck, FinalCheckRequest, GatewayAddition, PreparedContext, reply_json
from services.core.compaction.policy import ratio_threshold
from services.core.gateway_check import CheckInputs, GatewayRecord, gateway_record, verify_final
from services.core.hashing import canonical_json, sha256_hex
from services.core.served import ServedContext, served_of
from services.core.tokens import ENCODINGS, estimate_tokens
from services.core.tokens import counter_for as _counter_for
from contracts.exceptions import InvalidRequest, Overloaded, PreparedContextNotFound, StoreUnavailable
from services.store.final_checks import StoredCheck
from services.store.ports import GatewayStore, HookGrants, PrepareStore

__all__ = ["GatewayService", "encoding_of"]

log = logging.getLogger("ctxfleet.gateway")

# A check on another replica may arrive before the preparing one's write-behind landed: well above
# the flusher's delay (a batch is one statement).
_RECORD_WAIT_S = 1.0
_RECORD_POLL_S = 0.05
# Records stored per statement.
_WRITE_BATCH = 64
# Contexts kept in memory for their checks: an agent checks the context it was just given, so the
# newest thousand serve every step in flight; an older one is read from ctx.prepared_contexts.
_CACHED_CONTEXTS = 1024
# The write-behind's backoff while the store is unavailable: short first (a failover or a restart
# takes seconds), never longer than the cap, so records are stored within seconds of its return.
_RETRY_FIRST_S = 0.1
_RETRY_MAX_S = 5.0
# Block texts this process knows are stored, per (thread, digest): a block kept in view for many
# steps is sent to the store once, not at every step.
_TEXTS_REMEMBERED = 100_000
# While closing, the flusher retries at least this often within the shutdown's bound.
_RETRY_CLOSING_S = 0.5
# A record's JSON is mostly its digests: about this much per unit and per protected block, plus ids
# and figures. An estimate keeps the bound in bytes without serializing each record twice.
_UNIT_BYTES = 200
_BLOCK_BYTES = 300
_RECORD_BYTES = 1024
# A context with more messages than this is hashed in a worker thread: on the event loop it would hold
# every other request for tens of milliseconds (a whole-history view); smaller ones cost less than the hop.
_THREAD_HASH_MESSAGES = 400


def encoding_of(counting_method: str) -> str | None:
    """The encoding a budget report's counting method names; ``None`` for the bytes/4 estimate."""
    for name in ENCODINGS:
        if counting_method.startswith(f"tiktoken:{name}"):
            return name
    return None


def _count(encoding: str | None) -> Callable[[str], int]:
    for name in ENCODINGS:
        if name == encoding:
            return _counter_for(name).count
    return estimate_tokens


class GatewayService:
    """Remembers prepared contexts and checks final requests against them."""

    def __init__(
        self,
        store: GatewayStore,
        grants: HookGrants,
        policies: PrepareStore | None = None,
        *,
        cache_contexts: int = _CACHED_CONTEXTS,
        max_pending_records: int = 10_000,
        max_pending_bytes: int = 64 * 1024 * 1024,
        backoff_s: tuple[float, float] = (_RETRY_FIRST_S, _RETRY_MAX_S),
        before_derive: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        # Awaited before the write-behind derives what was remembered: the process's prepares go first
        # (workers/prepares_first.py).
        self._before_derive = before_derive
        self._grants = grants
        self._policies = policies
        # As sent (its JSON): one object where the model is ~500 for 50 messages, each walked again by every
        # full collection of the garbage collector while it is kept (docs/measurements.md).
        self._cache: OrderedDict[tuple[str, str], tuple[bytes, str, str | None]] = OrderedDict()
        self._cache_contexts = cache_contexts
        # Remembered, their records not derived yet; derived and not stored yet (invariant 1); and
        # stored already by this process (ids are deterministic: an unchanged view has the same one).
        self._unwritten: OrderedDict[tuple[str, str], tuple[PreparedContext, str, str | None]] = OrderedDict()
        self._pending: OrderedDict[tuple[str, str], _Pending] = OrderedDict()
        self._texts_stored: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._written: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._max_pending_records = max_pending_records
        self._max_pending_bytes = max_pending_bytes
        self._flusher: asyncio.Task[None] | None = None
        # Set to cut a backoff short (closing).
        self._wake = asyncio.Event()
        self._closing = False
        # The first and the longest pause between two tries of a batch (invariant 1).
        self._retry_first_s, self._retry_max_s = backoff_s
        self._backoff_s = self._retry_first_s
        # Read by the metrics (workers/metrics.py) at scrape time.
        self.pending_bytes = 0
        self.stored_records = 0
        self.retried_records = 0
        self.refused_prepares = 0
        self.dropped_records: Counter[str] = Counter()

    @property
    def pending_records(self) -> int:
        """Contexts answered whose records are not stored yet."""
        return len(self._unwritten) + len(self._pending)

    def remember(
        self,
        prepared: PreparedContext,
        tenant: str,
        *,
        carried_from: str | None = None,
        sent: bytes | None = None,
    ) -> None:
        """Keep ``prepared`` for its final check: O(1) here, the record is written behind.

        Args:
            sent: ``prepared`` as the reply carries it (``reply_json``), kept for a check served here;
                dumped here when not given.

        Raises:
            Overloaded: the records pending are at their bound (invariant 3); ``prepared`` must not
                be answered.
        """
        key = (prepared.prepared_id, prepared.format)
        if key not in self._written and key not in self._unwritten and key not in self._pending:
            if (
                self.pending_records >= self._max_pending_records
                or self.pending_bytes >= self._max_pending_bytes
            ):
                self.refused_prepares += 1
                retry_ms = max(1, int(1000 * self._backoff_s))
                raise Overloaded(
                    retry_ms, "gateway_records_pending", self._max_pending_records, limit_of="records pending"
                )
            self._unwritten[key] = (prepared, tenant, carried_from)
            if self._flusher is None or self._flusher.done():
                self._flusher = asyncio.get_running_loop().create_task(self._write_behind())
        self._cache[key] = (reply_json(prepared) if sent is None else sent, tenant, carried_from)
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_contexts:
            self._cache.popitem(last=False)

    async def flush(self) -> None:
        """Wait until every pending record is stored (tests); waits through an outage."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def close(self, timeout_s: float) -> int:
        """Store what is pending within ``timeout_s`` (shutdown, invariant 4); how many were dropped.

        Backoffs are cut short to at most 0.5 s meanwhile. What is still pending at the bound is
        counted (``dropped_records["shutdown"]``) and logged.
        """
        self._closing = True
        self._wake.set()
        flusher = self._flusher
        if flusher is not None and not flusher.done():
            await asyncio.wait({flusher}, timeout=timeout_s)
            if not flusher.done():
                flusher.cancel()
                await asyncio.gather(flusher, return_exceptions=True)
        left = self.pending_records
        if left:
            self.dropped_records["shutdown"] += left
            log.error(
                "shutdown: %d gateway records not stored within %.1fs (the store is unavailable); "
                "checks of those contexts on other replicas will answer prepared_context_not_found",
                left,
                timeout_s,
            )
            self._unwritten.clear()
            self._pending.clear()
            self.pending_bytes = 0
        return left

    async def check(self, request: FinalCheckRequest, *, tenant: str, thread_id: str) -> FinalCheck:
        """The verdict on a final request; raises the typed error of a request that may not be sent."""
        record = await self._record(request, tenant, thread_id)
        request_sha = sha256_hex(canonical_json(request.request))
        done = await self._store.select_check(request.prepared_id, request.attempt)
        if done is not None:
            if done.check.request_sha256 != request_sha or done.format != request.format:
                raise InvalidRequest(
                    f"attempt {request.attempt} of {request.prepared_id} was checked with another request; "
                    "a changed request is a new attempt"
                )
            return done.check
        soft = await self._soft_limit(tenant, record)
        reprepared = record.carried_from is not None or await self._store.has_reprepare(request.prepared_id)
        inputs = CheckInputs(
            request.request,
            request.additions,
            await self._grants.granted(tenant, record.session_id),
            soft,
            reprepared,
        )
        verdict = verify_final(record, inputs, _count(record.encoding))
        check = FinalCheck(
            check_id=f"{request.prepared_id}/{request.attempt}",
            prepared_id=request.prepared_id,
            attempt=request.attempt,
            outcome=verdict.outcome,
            final_tokens=verdict.final_tokens,
            input_budget=record.input_budget,
            remaining=verdict.remaining,
            soft_limit=soft,
            request_sha256=verdict.request_sha256,
            addition_sources=tuple(a.source for a in verdict.additions),
        )
        stored = await self._store.insert_check(
            StoredCheck(tenant, thread_id, request.format, check, tuple(dict.fromkeys(verdict.additions)))
        )
        return stored.check

    async def carried(self, check_id: str, *, tenant: str, thread_id: str) -> tuple[GatewayAddition, ...]:
        """The additions a ``context_reprepare_required`` check validated, for the re-prepare to include."""
        prepared_id, _, attempt = check_id.rpartition("/")
        found = (
            await self._store.select_check(prepared_id, int(attempt))
            if prepared_id and attempt.isdigit()
            else None
        )
        if (
            found is None
            or (found.tenant, found.thread_id) != (tenant, thread_id)
            or found.check.outcome != "context_reprepare_required"
        ):
            raise InvalidRequest(
                f"carry_additions_from names no check of this thread that asked to re-prepare: {check_id}"
            )
        return found.additions

    async def _record(self, request: FinalCheckRequest, tenant: str, thread_id: str) -> GatewayRecord:
        cached = self._cache.get((request.prepared_id, request.format))
        record: GatewayRecord | None
        if cached is not None:
            sent, owner, carried_from = cached
            prepared = PreparedContext.model_validate_json(sent)
            encoding = encoding_of(prepared.budget_report.counting_method)
            record = gateway_record(prepared, owner, encoding)
            if carried_from is not None:
                record = record.model_copy(update={"carried_from": carried_from})
        else:
            record = await self._stored(request.prepared_id, request.format)
        # Another tenant's or thread's context is reported exactly like a missing one.
        if record is None or (record.tenant, record.thread_id) != (tenant, thread_id):
            raise PreparedContextNotFound(request.prepared_id, request.format)
        return record

    async def _stored(self, prepared_id: str, format: str) -> GatewayRecord | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _RECORD_WAIT_S
        while True:
            record = await self._store.select_prepared(prepared_id, format)
            if record is not None or loop.time() >= deadline:
                return record
            await asyncio.sleep(_RECORD_POLL_S)

    async def _soft_limit(self, tenant: str, record: GatewayRecord) -> int | None:
        name, _, revision = record.policy.rpartition("@")
        if self._policies is None or not name or not revision.isdigit():
            return None
        async with self._policies.connection() as session:
            found = await session.get_policy(tenant, name, int(revision))
        ratio = found[1].compaction.triggers.context_ratio if found is not None else None
        return None if ratio is None else ratio_threshold(ratio, record.input_budget)

    async def _write_behind(self) -> None:
        failing: str | None = None
        while self._unwritten or self._pending:
            if self._unwritten and self._before_derive is not None:
                await self._before_derive()
            await self._derive()
            batch = list(islice(self._pending, _WRITE_BATCH))
            if not batch:
                continue
            try:
                await self._store_batch(batch)
            except StoreUnavailable as exc:
                # Invariant 1: kept, tried again; logged once per outage, not once per retry.
                self.retried_records += len(batch)
                if failing is None:
                    log.warning(
                        "could not store %d gateway records, retrying until the store is back: %s",
                        self.pending_records,
                        exc,
                    )
                failing = str(exc)
                await self._back_off()
                continue
            if failing is not None:
                log.info("gateway records stored again after the store was unavailable (%s)", failing)
                failing = None
            self._backoff_s = self._retry_first_s

    async def _derive(self) -> None:
        """Turn every remembered context into its record (small: digests, no content)."""
        while self._unwritten:
            key, (prepared, tenant, carried_from) = self._unwritten.popitem(last=False)
            try:
                record, served, texts = await _record_of(prepared, tenant)
            except Exception:  # a bug in deriving one record must not hold the others (invariant 2)
                self.dropped_records["underivable"] += 1
                log.exception("could not derive the gateway record of %s; dropped", prepared.prepared_id)
                continue
            record = record.model_copy(update={"carried_from": carried_from})
            fresh = {d: t for d, t in texts.items() if (served.thread_id, d) not in self._texts_stored}
            size = _approx_bytes(record) + sum(len(t) for t in fresh.values())
            self._pending[key] = _Pending(record, served, fresh, size)
            self.pending_bytes += size
            # One context per loop turn (a few ms of hashing each): a request read meanwhile is served
            # between two, not after the whole queue.
            await asyncio.sleep(0)

    async def _store_batch(self, batch: list[tuple[str, str]]) -> None:
        """Store ``batch`` of the pending records; raises ``StoreUnavailable`` with what is left pending.

        A refusal of anything else is a record at fault (invariant 2): the batch is stored a record at
        a time, and only the records refused alone are dropped.
        """
        pending = [self._pending[key] for key in batch]
        texts = {
            (p.served.thread_id, digest): (p.served.thread_id, digest, p.served.tenant, text)
            for p in pending
            for digest, text in p.texts.items()
        }
        try:
            await self._store.insert_prepared_many([p.record for p in pending])
            await self._store.insert_served_many([p.served for p in pending], list(texts.values()))
        except StoreUnavailable:
            raise
        except Exception:  # whatever the store refused: isolate it below
            if len(batch) == 1:
                self._drop_refused(batch[0])
                return
            for key in batch:
                await self._store_batch([key])
            return
        for key in batch:
            self._done(key)
        for text_key in texts:
            self._texts_stored[text_key] = None
        while len(self._texts_stored) > _TEXTS_REMEMBERED:
            self._texts_stored.popitem(last=False)

    def _drop_refused(self, key: tuple[str, str]) -> None:
        self.dropped_records["rejected"] += 1
        log.exception("the store refused the gateway record of %s; dropped", key[0])
        self._forget(key)

    def _done(self, key: tuple[str, str]) -> None:
        self._forget(key)
        self.stored_records += 1
        self._written[key] = None
        while len(self._written) > 4 * self._cache_contexts:
            self._written.popitem(last=False)

    def _forget(self, key: tuple[str, str]) -> None:
        found = self._pending.pop(key, None)
        if found is not None:
            self.pending_bytes -= found.size

    async def _back_off(self) -> None:
        delay = min(self._backoff_s, _RETRY_CLOSING_S) if self._closing else self._backoff_s
        self._backoff_s = min(self._retry_max_s, self._backoff_s * 2)
        self._wake.clear()
        if self._closing:
            await asyncio.sleep(delay)
            return
        with suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=delay)


_Derived = tuple[GatewayRecord, ServedContext, dict[str, str]]


def _derive_one(prepared: PreparedContext, tenant: str) -> _Derived:
    record = gateway_record(prepared, tenant, encoding_of(prepared.budget_report.counting_method))
    return (record, *served_of(prepared, tenant))


async def _record_of(prepared: PreparedContext, tenant: str) -> _Derived:
    """The check's record of ``prepared``, its served manifest and its blocks' texts by digest."""
    if len(prepared.messages) > _THREAD_HASH_MESSAGES:
        return await asyncio.to_thread(_derive_one, prepared, tenant)
    return _derive_one(prepared, tenant)


@dataclass(frozen=True, slots=True)
class _Pending:
    """A derived record waiting to be stored, with its served manifest and the texts not stored yet."""

    record: GatewayRecord
    served: ServedContext
    texts: dict[str, str]
    size: int


def _approx_bytes(record: GatewayRecord) -> int:
    return _RECORD_BYTES + _UNIT_BYTES * len(record.units) + _BLOCK_BYTES * len(record.manifest)
