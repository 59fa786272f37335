"""The fleet's NATS hook runner against a real scripted hook service on the embedded server."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.msg import Msg

from contracts import Purpose
from contracts._base import reply_json
from contracts.hook_protocol import HookAddition, HookCall, HookPatch, HookReply
from contracts.hooks import AdditionCategory, HookBinding, HookFailurePolicy, HookPoint
from services.app.hook_registry import HookRegistry
from services.core.hook_patches import check_prepare_before
from contracts.exceptions import HookTimeout
from services.store.memory import MemoryStore
from workers.hook_runner import NatsHookRunner

pytestmark = pytest.mark.anyio


class _Seen:
    def __init__(self) -> None:
        self.points: list[tuple[str, str]] = []

    def observe(self, point: HookPoint, outcome: str, seconds: float) -> None:
        self.points.append((point.value, outcome))


def _binding(subject: str, **kw: object) -> HookBinding:
    return HookBinding(
        name="policy",
        version="3",
        point=HookPoint.PREPARE_BEFORE,
        subject=subject,
        timeout_ms=200,
        grants=(AdditionCategory.MATERIAL,),
        **kw,  # type: ignore[arg-type]
    )


def _call(binding: HookBinding) -> HookCall:
    return HookCall(
        point=binding.point,
        hook=binding.source,
        tenant="default",
        session_id="s",
        thread_id="r.m",
        purpose=Purpose.ACTION,
    )


async def test_a_scripted_hook_service_answers_a_patch_and_a_silent_one_times_out_by_policy(
    nats_url: str,
) -> None:
    nc = await nats.connect(nats_url)
    try:

        async def answer(msg: Msg) -> None:
            call = HookCall.model_validate_json(msg.data)
            assert call.hook == "policy@3"
            patch = HookPatch(
                add=(HookAddition(category="material", title="doc", text="Refunds need approval."),)
            )
            await msg.respond(reply_json(HookReply(decision="patch", patch=patch)))

        async def silent(msg: Msg) -> None:
            await asyncio.sleep(1)

        await nc.subscribe("hooks.default.answering", cb=answer)
        await nc.subscribe("hooks.default.silent", cb=silent)
        seen = _Seen()
        registry = HookRegistry(MemoryStore(), NatsHookRunner(nc), seen)
        answering = _binding("hooks.default.answering")
        result = await registry.run(
            answering, _call(answering), lambda p: check_prepare_before(answering, p, ())
        )
        assert result.outcome == "patched" and result.patch is not None
        assert result.patch.add[0].text == "Refunds need approval."

        skipping = _binding("hooks.default.silent")
        skipped = await registry.run(skipping, _call(skipping), lambda p: [])
        assert skipped.outcome == "timeout" and skipped.patch is None
        failing = _binding("hooks.default.silent", failure=HookFailurePolicy.FAIL)
        with pytest.raises(HookTimeout):
            await registry.run(failing, _call(failing), lambda p: [])
        assert seen.points == [
            ("context.prepare.before", "patched"),
            ("context.prepare.before", "timeout"),
            ("context.prepare.before", "timeout"),
        ]
    finally:
        await nc.close()
