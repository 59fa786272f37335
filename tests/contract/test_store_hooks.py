"""Context hooks in both stores: the revision a session pins, and the hooks a summary records."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from contracts import SummaryHook
from contracts.hooks import HookBinding, HookPoint, HookSet
from tests.contract.test_store_contract import Store, _summary
from tests.contract.test_store_listing import _write
from tests.fixtures.builders import Thread, summary_hook

pytestmark = pytest.mark.anyio

_NARROWED = summary_hook("scope", "context.compact.before", "range 1–9 → 1–2")
_PATCHED = summary_hook("redact", "context.compact.after", "patched progress", version="3")


def _hooks(release: str, version: str) -> HookSet:
    binding = HookBinding(
        name="scope", version=version, point=HookPoint.COMPACT_BEFORE, subject="hooks.default.scope"
    )
    return HookSet(release=release, hooks=(binding,))


@pytest.mark.parametrize("hooks", [(_NARROWED, _PATCHED), ()], ids=["shaped", "unhooked"])
async def test_a_committed_summary_keeps_the_hooks_that_shaped_it_in_order(
    store: Store, hooks: tuple[SummaryHook, ...]
) -> None:
    t = Thread()
    await _write(store, [t.user("one", key="k1"), t.user("two", key="k2")])
    async with store.connection() as s:
        await s.ensure_view(t.thread_id)
        await s.commit_summary(0, dataclasses.replace(_summary(t.thread_id, 2), hooks=hooks))
        state = await s.load_view(t.thread_id)
    assert state.summary is not None and state.summary.hooks == hooks
    assert [e.hooks for e in await store.thread_compactions(t.thread_id)] == [hooks]


async def test_a_session_pins_the_hook_set_revision_current_at_its_first_event(store: Store) -> None:
    release = f"rel-{uuid.uuid4().hex[:8]}"
    assert await store.register_hooks("default", _hooks(release, "1")) == 1
    assert await store.register_hooks("default", _hooks(release, "2")) == 2
    t = Thread()
    await _write(store, [t.system("Be brief.").model_copy(update={"agent_release": release})])
    assert await store.register_hooks("default", _hooks(release, "3")) == 3
    recorded, pinned = await store.session_hooks("default", t.session_id)
    assert recorded and pinned is not None
    assert (pinned.revision, pinned.hooks.hooks[0].source) == (2, "scope@2")
    assert await store.session_hooks("acme", t.session_id) == (False, None)
    unhooked = Thread()
    await _write(store, [unhooked.user("hi", key="k1")])
    assert await store.session_hooks("default", unhooked.session_id) == (True, None)
