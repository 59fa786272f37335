"""The gateway's final checks: prepared-context records and check rows, in PostgreSQL and in memory.

Only SQL here (and its in-memory twin, which answers the same). A check row is written once per
``(prepared_id, attempt)``: a retried attempt reads back the verdict first recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import asyncpg

from contracts import FinalCheck, GatewayAddition
from contracts.hooks import AdditionCategory, HookSet
from services.core.gateway_check import GatewayRecord
from services.core.served import ServedContext
from services.store._errors import translate_pg_errors
from services.store.batch_write import unnest_args
from services.store.listing import ServedStep

__all__ = ["SERVED_STEPS_KEPT", "MemoryGatewayStore", "MemoryHookGrants", "PgGatewayStore", "StoredCheck"]

# A thread's newest served contexts kept: a person debugging looks at the last few hundred steps.
SERVED_STEPS_KEPT = 500

_INSERT_PREPARED_MANY = """
INSERT INTO ctx.prepared_contexts (prepared_id, format, tenant, thread_id, record)
SELECT p, f, t, th, r::jsonb
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(p, f, t, th, r)
ON CONFLICT (prepared_id, format) DO NOTHING
"""
# Steps are numbered per thread in the order the contexts are stored (a batch in its own order).
_INSERT_SERVED_MANY = """
WITH u AS (
    SELECT p, f, t, th, m::jsonb AS m, ord
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
        WITH ORDINALITY AS u(p, f, t, th, m, ord)
), fresh AS (
    SELECT u.* FROM u
    WHERE NOT EXISTS (SELECT 1 FROM ctx.served_contexts s WHERE s.prepared_id = u.p AND s.format = u.f)
)
INSERT INTO ctx.served_contexts (prepared_id, format, tenant, thread_id, step, manifest)
SELECT p, f, t, th,
       coalesce((SELECT max(step) FROM ctx.served_contexts s WHERE s.thread_id = fresh.th), 0)
           + row_number() OVER (PARTITION BY th ORDER BY ord),
       m
FROM fresh
ON CONFLICT (prepared_id, format) DO NOTHING
"""
# Replicas storing steps of one thread at once take turns, so no two number the same step (sorted:
# two batches lock their threads in one order and never wait on each other in a cycle).
_LOCK_SERVED_THREADS = """
SELECT pg_advisory_xact_lock(hashtextextended('ctx.served:' || t, 0))
FROM unnest($1::text[]) AS t ORDER BY t
"""
_INSERT_SERVED_TEXTS = """
INSERT INTO ctx.served_texts (thread_id, digest, tenant, text)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
ON CONFLICT (thread_id, digest) DO NOTHING
"""
_PRUNE_SERVED = """
DELETE FROM ctx.served_contexts s
USING (SELECT thread_id, max(step) AS last FROM ctx.served_contexts WHERE thread_id = ANY($1::text[])
       GROUP BY thread_id) m
WHERE s.thread_id = m.thread_id AND s.step <= m.last - $2
"""
# The columns a prepared context and a served one are keyed and filed by, before its JSON.
_KEYS = ("prepared_id", "format", "tenant", "thread_id")
_SELECT_PREPARED = "SELECT record FROM ctx.prepared_contexts WHERE prepared_id = $1 AND format = $2"
_INSERT_CHECK = """
INSERT INTO ctx.gateway_checks
    (prepared_id, attempt, tenant, thread_id, format, outcome, final_tokens, input_budget, soft_limit,
     request_sha256, addition_sources, additions)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12::jsonb)
ON CONFLICT (prepared_id, attempt) DO NOTHING
"""
_SELECT_CHECK = """
SELECT prepared_id, attempt, tenant, thread_id, format, outcome, final_tokens, input_budget, soft_limit,
       request_sha256, addition_sources, additions
FROM ctx.gateway_checks WHERE prepared_id = $1 AND attempt = $2
"""
_HAS_REPREPARE = """
SELECT EXISTS (
    SELECT 1 FROM ctx.gateway_checks WHERE prepared_id = $1 AND outcome = 'context_reprepare_required'
)
"""


@dataclass(frozen=True, slots=True)
class StoredCheck:
    """A recorded verdict: what the model was (to be) sent, and the additions it validated."""

    tenant: str
    thread_id: str
    format: str
    check: FinalCheck
    additions: tuple[GatewayAddition, ...]


class PgGatewayStore:
    """``ctx.prepared_contexts`` and ``ctx.gateway_checks`` over one pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def insert_prepared(self, record: GatewayRecord) -> None:
        """Keep ``record``; the same id and format again is a no-op (prepared ids are deterministic)."""
        await self.insert_prepared_many((record,))

    async def insert_prepared_many(self, records: Sequence[GatewayRecord]) -> None:
        if not records:
            return
        with translate_pg_errors():
            async with self._pool.acquire() as conn:
                await conn.execute(
                    _INSERT_PREPARED_MANY,
                    *unnest_args(records, *_KEYS),
                    [r.model_dump_json() for r in records],
                )

    async def insert_served_many(
        self, served: Sequence[ServedContext], texts: Sequence[tuple[str, str, str, str]]
    ) -> None:
        """Keep each served manifest (once per id and format) and the block texts not stored yet.

        ``texts``: ``(thread_id, digest, tenant, text)``. A thread's steps beyond the newest
        ``SERVED_STEPS_KEPT`` are deleted in the same transaction.
        """
        if not served and not texts:
            return
        with translate_pg_errors():
            async with self._pool.acquire() as conn, conn.transaction():
                if texts:
                    columns = (list(column) for column in zip(*texts, strict=True))
                    await conn.execute(_INSERT_SERVED_TEXTS, *columns)
                if served:
                    threads = sorted({s.thread_id for s in served})
                    await conn.execute(_LOCK_SERVED_THREADS, threads)
                    await conn.execute(
                        _INSERT_SERVED_MANY,
                        *unnest_args(served, *_KEYS),
                        [s.model_dump_json() for s in served],
                    )
                    await conn.execute(_PRUNE_SERVED, threads, SERVED_STEPS_KEPT)

    async def select_prepared(self, prepared_id: str, format: str) -> GatewayRecord | None:
        with translate_pg_errors():
            async with self._pool.acquire() as conn:
                raw = await conn.fetchval(_SELECT_PREPARED, prepared_id, format)
        return None if raw is None else GatewayRecord.model_validate_json(raw)

    async def insert_check(self, stored: StoredCheck) -> StoredCheck:
        c = stored.check
        additions = json.dumps([a.model_dump(mode="json") for a in stored.additions])
        with translate_pg_errors():
            async with self._pool.acquire() as conn:
                await conn.execute(
                    _INSERT_CHECK,
                    c.prepared_id,
                    c.attempt,
                    stored.tenant,
                    stored.thread_id,
                    stored.format,
                    c.outcome,
                    c.final_tokens,
                    c.input_budget,
                    c.soft_limit,
                    c.request_sha256,
                    list(c.addition_sources),
                    additions,
                )
                row = await conn.fetchrow(_SELECT_CHECK, c.prepared_id, c.attempt)
        assert row is not None, "the check row was just written or already there"
        return _check_of(row)

    async def select_check(self, prepared_id: str, attempt: int) -> StoredCheck | None:
        with translate_pg_errors():
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(_SELECT_CHECK, prepared_id, attempt)
        return None if row is None else _check_of(row)

    async def has_reprepare(self, prepared_id: str) -> bool:
        with translate_pg_errors():
            async with self._pool.acquire() as conn:
                return bool(await conn.fetchval(_HAS_REPREPARE, prepared_id))


def _check_of(row: asyncpg.Record) -> StoredCheck:
    additions = tuple(GatewayAddition.model_validate(a) for a in json.loads(row["additions"]))
    check = FinalCheck(
        check_id=f"{row['prepared_id']}/{row['attempt']}",
        prepared_id=row["prepared_id"],
        attempt=row["attempt"],
        outcome=row["outcome"],
        final_tokens=row["final_tokens"],
        input_budget=row["input_budget"],
        remaining=row["input_budget"] - row["final_tokens"],
        soft_limit=row["soft_limit"],
        request_sha256=row["request_sha256"],
        addition_sources=tuple(row["addition_sources"]),
    )
    return StoredCheck(row["tenant"], row["thread_id"], row["format"], check, additions)


@dataclass
class MemoryGatewayStore:
    """The in-memory twin of :class:`PgGatewayStore`."""

    prepared: dict[tuple[str, str], GatewayRecord] = field(default_factory=dict)
    checks: dict[tuple[str, int], StoredCheck] = field(default_factory=dict)
    # Per thread, its served steps in order; block texts by (thread, digest). ``MemoryStore`` reads
    # them as PostgreSQL's listing reads the gateway's tables of the same database.
    served: dict[str, list[ServedStep]] = field(default_factory=dict)
    served_texts: dict[tuple[str, str], str] = field(default_factory=dict)

    async def insert_prepared(self, record: GatewayRecord) -> None:
        self.prepared.setdefault((record.prepared_id, record.format), record)

    async def insert_prepared_many(self, records: Sequence[GatewayRecord]) -> None:
        for record in records:
            await self.insert_prepared(record)

    async def insert_served_many(
        self, served: Sequence[ServedContext], texts: Sequence[tuple[str, str, str, str]]
    ) -> None:
        for thread_id, digest, _, text in texts:
            self.served_texts.setdefault((thread_id, digest), text)
        for s in served:
            steps = self.served.setdefault(s.thread_id, [])
            if all((o.served.prepared_id, o.served.format) != (s.prepared_id, s.format) for o in steps):
                step = steps[-1].step + 1 if steps else 1
                steps.append(ServedStep(step, datetime.now(timezone.utc), s))
                del steps[:-SERVED_STEPS_KEPT]

    async def select_prepared(self, prepared_id: str, format: str) -> GatewayRecord | None:
        return self.prepared.get((prepared_id, format))

    async def insert_check(self, stored: StoredCheck) -> StoredCheck:
        return self.checks.setdefault((stored.check.prepared_id, stored.check.attempt), stored)

    async def select_check(self, prepared_id: str, attempt: int) -> StoredCheck | None:
        return self.checks.get((prepared_id, attempt))

    async def has_reprepare(self, prepared_id: str) -> bool:
        return any(
            p == prepared_id and s.check.outcome == "context_reprepare_required"
            for (p, _), s in self.checks.items()
        )


@dataclass
class MemoryHookGrants:
    """The in-memory twin of the ``HookGrants`` port: each session's hook set, as registered for it.

    For a gateway without the hook store (the fleet's reads them from ``HookRegistry``): a source no
    session was given here is granted nothing, so every addition is refused.
    """

    sessions: dict[tuple[str, str], HookSet] = field(default_factory=dict)

    def use(self, tenant: str, session_id: str, hooks: HookSet) -> None:
        self.sessions[(tenant, session_id)] = hooks

    async def granted(self, tenant: str, session_id: str) -> Mapping[str, frozenset[AdditionCategory]]:
        hooks = self.sessions.get((tenant, session_id))
        if hooks is None:
            return {}
        return {h.source: frozenset(h.grants) for h in hooks.hooks if h.grants}
