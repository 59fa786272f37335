"""The prepare's hook points: context.prepare.before (add, deselect, reject) and .after (annotate).

Hooks run in registration order; each sees the candidates as the previous ones left them. Only what
a hook's point allows is taken (services.core.hook_patches), and every hook that ran is named in the
prepared context, with its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from contracts import PreparedContext, PrepareRequest, thread_id_of
from contracts.hook_protocol import HookBlock, HookCall, HookPatch
from contracts.hooks import HookBinding, HookPoint, HookSet
from contracts.prepare import HookTouch

from services.app.hook_registry import HookRegistry
from services.core.assemble import ThreadSnapshot, candidate_blocks
from services.core.groups import DraftBlock
from services.core.hook_patches import (
    PrepareHookChange,
    addition_blocks,
    check_prepare_after,
    check_prepare_before,
    hook_blocks,
)
from services.core.tokens import TokenCounter, estimate_tokens

__all__ = ["PrepareHooks", "after_prepare", "before_prepare"]

_AFTER: Final = "context.prepare.after"


@dataclass
class PrepareHooks:
    """What the prepare.before hooks left for the assembler, and who touched the context."""

    change: PrepareHookChange | None = None
    touches: list[HookTouch] = field(default_factory=list)


def _tokens(blocks: list[DraftBlock], counter: TokenCounter | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for b in blocks:
        text = "\n".join(m.content or "" for m in b.messages)
        out[b.block_id] = counter.count(text) if counter is not None else estimate_tokens(text)
    return out


def _call(point: HookPoint, binding: HookBinding, tenant: str, request: PrepareRequest) -> HookCall:
    return HookCall(
        point=point,
        hook=binding.source,
        tenant=tenant,
        session_id=request.session_id,
        thread_id=thread_id_of(request.run_id, request.instance_id),
        purpose=request.purpose,
    )


async def before_prepare(
    registry: HookRegistry,
    hooks: HookSet | None,
    tenant: str,
    snapshot: ThreadSnapshot,
    request: PrepareRequest,
    counter: TokenCounter | None,
) -> PrepareHooks:
    """Run the session's prepare.before hooks for the request's purpose (``HookRejected`` on a reject)."""
    out = PrepareHooks()
    bindings = registry.bindings(hooks, HookPoint.PREPARE_BEFORE, request.purpose)
    if not bindings:
        return out
    change = PrepareHookChange()
    for binding in bindings:
        ordered = change.apply(candidate_blocks(snapshot, request, counter))
        candidates = hook_blocks(ordered, _tokens(ordered, counter))
        call = _call(HookPoint.PREPARE_BEFORE, binding, tenant, request).model_copy(
            update={"blocks": candidates}
        )

        def check(
            patch: HookPatch, b: HookBinding = binding, c: tuple[HookBlock, ...] = candidates
        ) -> list[str]:
            return check_prepare_before(b, patch, c)

        result = await registry.run(binding, call, check)
        if result.patch is not None and (result.patch.add or result.patch.deselect):
            change = PrepareHookChange(
                additions=(*change.additions, *addition_blocks(binding, result.patch)),
                deselected=change.deselected | frozenset(result.patch.deselect),
            )
        out.touches.append(
            HookTouch(
                source=binding.source,
                point="context.prepare.before",
                outcome=result.outcome,
                note=result.note or "",
            )
        )
    out.change = change if change.additions or change.deselected else None
    return out


async def after_prepare(
    registry: HookRegistry,
    hooks: HookSet | None,
    tenant: str,
    request: PrepareRequest,
    prepared: PreparedContext,
    touches: list[HookTouch],
) -> PreparedContext:
    """Run the prepare.after hooks (read-only) and name every hook that ran in the context."""
    touched = list(touches)
    for binding in registry.bindings(hooks, HookPoint.PREPARE_AFTER, request.purpose):
        call = _call(HookPoint.PREPARE_AFTER, binding, tenant, request).model_copy(
            update={
                "prepared_id": prepared.prepared_id,
                "blocks": tuple(
                    HookBlock(
                        block_id=b.block_id, kind=b.kind, retention=b.retention, tokens=b.tokens, text=""
                    )
                    for b in prepared.blocks
                ),
            }
        )
        result = await registry.run(binding, call, check_prepare_after)
        if result.patch is not None and result.patch.annotations:
            touched += [
                HookTouch(source=binding.source, point=_AFTER, outcome="annotated", note=a.text)
                for a in result.patch.annotations
            ]
        else:
            touched.append(
                HookTouch(source=binding.source, point=_AFTER, outcome=result.outcome, note=result.note or "")
            )
    if not touched:
        return prepared
    return prepared.model_copy(update={"hooks": tuple(touched)})
