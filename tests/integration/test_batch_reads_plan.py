"""The recorder's batch reads (``ctx.batch_reads``) are planned once per connection, and
that one plan must stay right as the ledger grows from nothing.

A generic plan is made from the table sizes of its moment: made on an empty database, a join of the
batch's keys to ``ctx.records`` was a hash join over a scan of the whole ledger, run again on every
batch until statistics arrived. Each lookup by key is written so that no plan can do that; this reads
the function's statement back from the database and asks PostgreSQL how it would run it generically.
"""

from __future__ import annotations

import re

import asyncpg
import pytest

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

# Tables that grow with the ledger; ``ctx.policies`` holds a tenant's named policies (a handful).
_GROWING = (
    "records",
    "tool_calls",
    "thread_heads",
    "sessions",
    "runs",
    "receipts",
    "tool_catalogs",
    "state_facts",
    "state_versions",
    "tracking",
)


async def _function(conn: asyncpg.Connection) -> asyncpg.Record:
    row = await conn.fetchrow(
        """
        SELECT p.prosrc, p.proargnames, p.proconfig,
               ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t) AS types
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'ctx' AND p.proname = 'batch_reads'
        """
    )
    assert row is not None, "the baseline migration defines ctx.batch_reads"
    return row


def _as_prepared_statement(row: asyncpg.Record) -> str:
    """The function's query with its parameters as ``$n`` (its input names precede its output names)."""
    body = re.search(r"RETURN QUERY(.*?);\s*END", row["prosrc"], re.S)
    assert body is not None
    query: str = body.group(1)
    for n, (name, kind) in enumerate(zip(row["proargnames"], row["types"], strict=False), start=1):
        query = re.sub(rf"(?<![\w.]){name}(?!\w)", f"${n}::{kind}", query)
    return query


async def test_the_batch_reads_run_on_one_generic_plan_per_connection(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        row = await _function(conn)
    finally:
        await conn.close()
    assert "plan_cache_mode=force_generic_plan" in (row["proconfig"] or [])


async def test_a_generic_plan_made_on_an_empty_ledger_looks_every_key_up_by_index(database_url: str) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        row = await _function(conn)
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE reads AS {_as_prepared_statement(row)}")
        arguments = ", ".join(["ARRAY['a']::text[]"] * 13 + ["'recorder'", "0"])
        plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE reads({arguments})"))
    finally:
        await conn.close()
    scanned = [t for t in _GROWING if re.search(rf"Seq Scan on {t}\b", plan)]
    assert not scanned, f"whole-table scans of {scanned} in:\n{plan}"
    assert "Hash Join" not in plan, plan
    # Every table the reads touch was looked at, each through its index.
    for table in _GROWING:
        by_index = rf"Index (Only )?Scan( Backward)? using \w+ on {table}\b|Bitmap Heap Scan on {table}\b"
        assert re.search(by_index, plan), f"{table} not read by index in:\n{plan}"
