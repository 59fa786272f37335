"""The compactor's context.compact.after hooks: a patch of the candidate summary's allowed fields,
validated again like the summarizer's own output before anything is committed (seed 000 §9, §10)."""

from __future__ import annotations

from collections.abc import Callable

from contracts import Purpose
from contracts.hook_protocol import HookCall, HookRange
from contracts.hooks import HookPoint

from services.app.hooks import HookRegistry
from services.core.compaction.model import StructuredSummary
from services.core.compaction.validate import CandidateInvalid
from services.core.hooks import check_compact_after, summary_after_hook

__all__ = ["after_compaction"]


async def after_compaction(
    registry: HookRegistry,
    tenant: str,
    session_id: str,
    thread_id: str,
    summary: StructuredSummary,
    revalidate: Callable[[StructuredSummary], None],
) -> tuple[StructuredSummary, tuple[str, ...]]:
    """The summary after the session's compact.after hooks, and the sources of those that patched it.

    ``CandidateInvalid`` when a patched summary fails validation (a dropped file write, a dropped
    constraint …): the compaction fails and the old view stays.
    """
    sources: list[str] = []
    hooks = await registry.hooks_of(tenant, session_id)
    for binding in registry.bindings(hooks, HookPoint.COMPACT_AFTER, Purpose.COMPACTION):
        call = HookCall(
            point=binding.point,
            hook=binding.source,
            tenant=tenant,
            session_id=session_id,
            thread_id=thread_id,
            purpose=Purpose.COMPACTION,
            range=HookRange(from_seq=summary.covered_from, to_seq=summary.covered_to),
            summary=summary.model_dump(mode="json"),
        )
        result = await registry.run(binding, call, check_compact_after)
        if result.patch is None or not result.patch.summary_fields:
            continue
        patched, problems = summary_after_hook(summary, result.patch.summary_fields)
        if patched is None:
            raise CandidateInvalid([f"{binding.source}: {p}" for p in problems])
        try:
            revalidate(patched)
        except CandidateInvalid as exc:
            raise CandidateInvalid([f"{binding.source}: {p}" for p in exc.problems]) from None
        summary, sources = patched, [*sources, binding.source]
    return summary, tuple(sources)
