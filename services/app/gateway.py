"""The gateway's final check as a use case: know each prepared context by id, check what is sent.

Keeping what a check needs never slows a prepare: the assembler hands its reply to :meth:`remember`,
which only puts the (already built) ``PreparedContext`` into a bounded in-process cache and queues
it for the write-behind. One flusher per process derives each queued context's record (the manifest,
a digest per unit, the budget figures — never content) and stores the batch under
``(prepared_id, format)`` in one statement. It starts only once the process's prepares in progress
are answered (``before_write``, bounded), hashes a record at a time, and skips a context it
already stored (an unchanged view prepared again has the same id): measured, a record hashed per
prepare in a worker thread cost 2.5 ms of a 6.5 ms round trip, the thread contending for the
interpreter lock while the reply was being sent (issue 16). A check served by the process that
prepared finds the context in the cache; any other replica reads the record, and waits a moment
for one still being written before it answers ``prepared_context_not_found``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from contracts import FinalCheck, FinalCheckRequest, GatewayAddition, PreparedContext
from services.core.compaction.policy import ratio_threshold
from services.core.gateway_check import CheckInputs, GatewayRecord, gateway_record, verify_final
from services.core.hashing import canonical_json, sha256_hex
from services.core.protected import ChatUnitDigests
from services.core.tokens import ENCODINGS, estimate_tokens
from services.core.tokens import counter_for as _counter_for
from services.errors import InvalidRequest, PreparedContextNotFound
from services.store.gateway import StoredCheck
from services.store.ports import GatewayStore, HookGrants, PrepareStore

__all__ = ["GatewayService", "encoding_of"]

log = logging.getLogger("ctxfleet.gateway")

# A check on another replica may arrive before the preparing one's write-behind landed: well above
# the flusher's delay (``before_write`` is bounded, then a batch is one statement).
_RECORD_WAIT_S = 1.0
_RECORD_POLL_S = 0.05
# Contexts queued for the write-behind at most; beyond it a record is not stored (a check then needs
# this process, which still holds the context in its cache).
_MAX_PENDING_WRITES = 256
# Records stored per statement.
_WRITE_BATCH = 64
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
        cache_contexts: int = 1024,
        before_write: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        # Awaited before a record is hashed: the process's prepares in progress go first (issue 16).
        self._before_write = before_write
        self._grants = grants
        self._policies = policies
        self._cache: OrderedDict[tuple[str, str], tuple[PreparedContext, str, str | None]] = OrderedDict()
        self._cache_contexts = cache_contexts
        # Queued for the write-behind, and stored already by this process (ids are deterministic).
        self._unwritten: OrderedDict[tuple[str, str], tuple[PreparedContext, str, str | None]] = OrderedDict()
        self._written: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._flusher: asyncio.Task[None] | None = None
        # Chat messages hashed already: a thread's next record hashes only its new messages.
        self._digests = ChatUnitDigests()
        self.dropped_writes = 0

    def remember(self, prepared: PreparedContext, tenant: str, *, carried_from: str | None = None) -> None:
        """Keep ``prepared`` for its final check: O(1) here, the record is written behind."""
        key = (prepared.prepared_id, prepared.format)
        self._cache[key] = (prepared, tenant, carried_from)
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_contexts:
            self._cache.popitem(last=False)
        if key in self._written or key in self._unwritten:
            return
        if len(self._unwritten) >= _MAX_PENDING_WRITES:
            self.dropped_writes += 1
            return
        self._unwritten[key] = (prepared, tenant, carried_from)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._write_behind())

    async def flush(self) -> None:
        """Wait until every queued record is stored (tests, shutdown)."""
        while self._flusher is not None and not self._flusher.done():
            await asyncio.gather(self._flusher, return_exceptions=True)

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
            StoredCheck(tenant, thread_id, request.format, check, _distinct(verdict.additions))
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
            prepared, owner, carried_from = cached
            encoding = encoding_of(prepared.budget_report.counting_method)
            record = gateway_record(prepared, owner, encoding, self._digests)
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
        async with self._policies.session() as session:
            found = await session.get_policy(tenant, name, int(revision))
        ratio = found[1].compaction.triggers.context_ratio if found is not None else None
        return None if ratio is None else ratio_threshold(ratio, record.input_budget)

    async def _write_behind(self) -> None:
        while self._unwritten:
            batch: list[GatewayRecord] = []
            keys: list[tuple[str, str]] = []
            while self._unwritten and len(batch) < _WRITE_BATCH:
                # Before each record: a prepare that arrived meanwhile is answered first.
                if self._before_write is not None:
                    await self._before_write()
                key, (prepared, tenant, carried_from) = self._unwritten.popitem(last=False)
                try:
                    record = await _record_of(prepared, tenant, self._digests)
                except Exception:  # a lost record only sends that context's checks to this process's cache
                    log.exception("could not derive the gateway record of %s", prepared.prepared_id)
                    continue
                batch.append(record.model_copy(update={"carried_from": carried_from}))
                keys.append(key)
            if not batch:
                continue
            try:
                await self._store.insert_prepared_many(batch)
            except Exception:
                log.exception("could not store %d gateway records", len(batch))
                continue
            for key in keys:
                self._written[key] = None
            while len(self._written) > 4 * self._cache_contexts:
                self._written.popitem(last=False)


async def _record_of(prepared: PreparedContext, tenant: str, digests: ChatUnitDigests) -> GatewayRecord:
    encoding = encoding_of(prepared.budget_report.counting_method)
    if len(prepared.messages) > _THREAD_HASH_MESSAGES:
        return await asyncio.to_thread(gateway_record, prepared, tenant, encoding, digests)
    return gateway_record(prepared, tenant, encoding, digests)


def _distinct(additions: tuple[GatewayAddition, ...]) -> tuple[GatewayAddition, ...]:
    seen: list[GatewayAddition] = []
    for a in additions:
        if a not in seen:
            seen.append(a)
    return tuple(seen)
