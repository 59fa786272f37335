"""Forward-only, numbered SQL migrations, applied once each under an advisory lock."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

__all__ = ["MigrationError", "apply_migrations", "list_migrations", "pending_migrations"]

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")
# Any constant works; it only has to be the same for every process that migrates this database.
_LOCK_KEY = 0x63747866  # "ctxf"


class MigrationError(RuntimeError):
    """A migration folder or history that cannot be applied safely."""


def list_migrations(directory: Path) -> list[tuple[int, str, str]]:
    """``(version, name, sql)`` of every migration file, in order; gaps are an error."""
    found: list[tuple[int, str, str]] = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file name must be NNNN_name.sql: {path.name}")
        found.append((int(match.group(1)), path.name, path.read_text(encoding="utf-8")))
    for expected, (version, name, _) in enumerate(found, start=1):
        if version != expected:
            raise MigrationError(f"migration {name} is out of sequence (expected {expected:04d})")
    return found


async def apply_migrations(conn: asyncpg.Connection, directory: Path) -> list[str]:
    """Apply every migration not yet applied; returns the names applied now."""
    applied_now: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        await conn.execute("CREATE SCHEMA IF NOT EXISTS ctx")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS ctx.schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {
            r["version"]: r["name"]
            for r in await conn.fetch("SELECT version, name FROM ctx.schema_migrations")
        }
        for version, name, sql in list_migrations(directory):
            if version in done:
                if done[version] != name:
                    raise MigrationError(
                        f"migration {version} was applied as {done[version]}, now named {name}"
                    )
                continue
            await conn.execute(sql)
            await conn.execute(
                "INSERT INTO ctx.schema_migrations (version, name) VALUES ($1, $2)", version, name
            )
            applied_now.append(name)
    return applied_now


async def pending_migrations(conn: asyncpg.Connection, directory: Path) -> list[str]:
    """The migrations this build has that the database has not applied (read-only)."""
    exists = await conn.fetchval("SELECT to_regclass('ctx.schema_migrations') IS NOT NULL")
    done = (
        {r["version"] for r in await conn.fetch("SELECT version FROM ctx.schema_migrations")}
        if exists
        else set()
    )
    return [name for version, name, _ in list_migrations(directory) if version not in done]
