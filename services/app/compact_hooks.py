"""The compactor's context hooks.

compact.before sees the candidate range and the summary's target; it may narrow the range to an
earlier end (a summary covers a contiguous prefix of what is not yet covered, so the start is not
the hook's to move) and lower the target. It can never add to what is summarized, so a pending
group, a required constraint or anything the selection kept out stays out. compact.after may patch
the candidate summary's allowed fields, validated again like the summarizer's own output before
anything is committed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from contracts import Purpose, SummaryHook
from contracts.hook_protocol import HookCall, HookPatch, HookRange
from contracts.hooks import HookPoint

from services.app.hook_registry import HookRegistry
from services.core.compaction.model import StructuredSummary
from services.core.groups import DraftBlock
from services.core.compaction.validate import CandidateInvalid
from services.core.hook_patches import (
    check_compact_after,
    check_compact_before,
    summary_after_hook,
    summary_hook,
)

__all__ = ["CompactionScope", "after_compaction", "before_compaction"]


@dataclass(frozen=True, slots=True)
class CompactionScope:
    """What compact.before hooks left of a job: the blocks to summarize, the target, who narrowed it."""

    blocks: tuple[DraftBlock, ...]
    target_tokens: int
    hooks: tuple[SummaryHook, ...] = ()


async def before_compaction(
    registry: HookRegistry,
    tenant: str,
    session_id: str,
    thread_id: str,
    blocks: Sequence[DraftBlock],
    target_tokens: int,
) -> CompactionScope:
    """The session's compact.before hooks over the candidate ``blocks`` (oldest first).

    A hook that rejects, or (policy fail) asks for what it may not, raises its typed error: the job
    fails and the old view stays.
    """
    scope = CompactionScope(tuple(blocks), target_tokens)
    pinned = await registry.pinned_of(tenant, session_id)
    if pinned is None:
        return scope
    for binding in registry.bindings(pinned.hooks, HookPoint.COMPACT_BEFORE, Purpose.COMPACTION):
        seqs = [r.seq for b in scope.blocks for r in b.records]
        if not seqs:
            break
        candidate = HookRange(from_seq=min(seqs), to_seq=max(seqs))
        target = scope.target_tokens

        def check(patch: HookPatch, candidate: HookRange = candidate, target: int = target) -> list[str]:
            problems = check_compact_before(patch, candidate, target)
            if patch.narrow_to is not None and patch.narrow_to.from_seq != candidate.from_seq:
                problems.append(
                    f"narrow_to may only end the range earlier: it starts at {candidate.from_seq}, "
                    "where the summary's coverage continues"
                )
            return problems

        call = HookCall(
            point=binding.point,
            hook=binding.source,
            tenant=tenant,
            session_id=session_id,
            thread_id=thread_id,
            purpose=Purpose.COMPACTION,
            range=candidate,
            summary_target_tokens=target,
        )
        result = await registry.run(binding, call, check)
        if result.patch is None:
            continue
        end = result.patch.narrow_to.to_seq if result.patch.narrow_to else candidate.to_seq
        lowered = min(target, result.patch.summary_target_tokens or target)
        changes: list[str] = []
        if end < candidate.to_seq:
            changes.append(f"range {candidate.from_seq}–{candidate.to_seq} → {candidate.from_seq}–{end}")
        if lowered < target:
            changes.append(f"target {target} → {lowered}")
        scope = CompactionScope(
            tuple(b for b in scope.blocks if all(r.seq <= end for r in b.records)),
            lowered,
            # Only a hook that changed something shaped the summary; a patch that restates the
            # candidate range and target is recorded as having run (metrics), not as having narrowed.
            (*scope.hooks, summary_hook(binding, pinned.hooks.release, pinned.revision, "; ".join(changes)))
            if changes
            else scope.hooks,
        )
    return scope


async def after_compaction(
    registry: HookRegistry,
    tenant: str,
    session_id: str,
    thread_id: str,
    summary: StructuredSummary,
    revalidate: Callable[[StructuredSummary], None],
) -> tuple[StructuredSummary, tuple[SummaryHook, ...]]:
    """The summary after the session's compact.after hooks, and those that patched it.

    ``CandidateInvalid`` when a patched summary fails validation (a dropped file write, a dropped
    constraint …): the compaction fails and the old view stays.
    """
    patched_by: list[SummaryHook] = []
    pinned = await registry.pinned_of(tenant, session_id)
    if pinned is None:
        return summary, ()
    for binding in registry.bindings(pinned.hooks, HookPoint.COMPACT_AFTER, Purpose.COMPACTION):
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
        fields = ", ".join(sorted(result.patch.summary_fields))
        summary = patched
        patched_by.append(summary_hook(binding, pinned.hooks.release, pinned.revision, f"patched {fields}"))
    return summary, tuple(patched_by)
