"""Hook sets in PostgreSQL: revisions per release, and a session keeps the one current at its creation."""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from contracts.hooks import HookBinding, HookPoint, HookSet
from services.store.hook_sets import insert_hooks, select_session_hooks

pytestmark = pytest.mark.anyio


def _set(release: str, version: str) -> HookSet:
    return HookSet(
        release=release,
        hooks=(
            HookBinding(name="p", version=version, point=HookPoint.PREPARE_BEFORE, subject="hooks.default.p"),
        ),
    )


async def test_a_session_uses_the_hook_revision_current_when_it_was_created(db: asyncpg.Connection) -> None:
    release, tenant = f"rel-{uuid.uuid4().hex[:8]}", "default"
    session = f"s-{uuid.uuid4().hex[:8]}"
    assert await insert_hooks(db, tenant, _set(release, "1")) == 1
    await db.execute(
        "INSERT INTO ctx.sessions (session_id, tenant, agent_release, policy_name, policy_revision)"
        " SELECT $1, $2, $3, name, revision FROM ctx.policies LIMIT 1",
        session,
        tenant,
        release,
    )
    assert await insert_hooks(db, tenant, _set(release, "2")) == 2
    recorded, pinned = await select_session_hooks(db, tenant, session)
    assert recorded and pinned is not None and pinned.hooks.hooks[0].source == "p@1"
    assert pinned.revision == 1  # recorded with every summary a hook of it shapes
    assert await select_session_hooks(db, "other", session) == (False, None)
    assert await select_session_hooks(db, tenant, "missing") == (False, None)
