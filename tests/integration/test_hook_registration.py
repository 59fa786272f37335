"""Registering a release's context hooks over NATS: revisions, and subjects kept to the tenant's own."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from contracts.hooks import HookBinding, HookPoint, HookSet
from ctxfleet_client.client import FleetClient
from contracts.exceptions import InvalidRequest

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


def _hooks(release: str, subject: str) -> HookSet:
    return HookSet(
        release=release,
        hooks=(HookBinding(name="policy", version="1", point=HookPoint.PREPARE_BEFORE, subject=subject),),
    )


async def test_each_registration_of_a_release_is_a_new_revision(fleet: Any, client: FleetClient) -> None:
    release = f"rel-{uuid.uuid4().hex[:8]}"
    first = await client.register_hooks(_hooks(release, "hooks.default.policy"))
    second = await client.register_hooks(_hooks(release, "hooks.default.policy-v2"))
    assert (first.release, second.release) == (release, release)
    assert second.revision == first.revision + 1


async def test_a_hook_subject_under_another_tenant_is_refused_at_registration(
    fleet: Any, client: FleetClient
) -> None:
    with pytest.raises(InvalidRequest, match="hooks.default."):
        await client.register_hooks(_hooks(f"rel-{uuid.uuid4().hex[:8]}", "hooks.acme.policy"))


def test_a_hook_subject_outside_the_hooks_tree_is_not_a_binding() -> None:
    for subject in ("ctx.prepare.default", "hooks.default", "policy.default.x", "hooks.default.*"):
        with pytest.raises(ValueError):
            _hooks("r", subject)
