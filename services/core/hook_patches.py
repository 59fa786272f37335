"""What a context hook's answer may change, checked before anything of it is used. Pure.

A hook's patch is taken whole or not at all: one refused change drops the patch (the stage goes
on as if the hook had answered ``continue``, or fails, by the binding's policy). Taking the rest
of a half-refused patch would assemble a context nobody asked for.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, assert_never

from pydantic import JsonValue, ValidationError

from contracts import BlockKind, Retention, SummaryHook
from contracts.hook_protocol import SUMMARY_PATCH_FIELDS, HookBlock, HookPatch, HookRange
from contracts.hooks import HookBinding, HookPoint

from services.core.compaction.model import StructuredSummary
from services.core.groups import DraftBlock, user_block

__all__ = [
    "HOOK_BLOCK_PREFIX",
    "HOOK_REFUSED",
    "PrepareHookChange",
    "addition_blocks",
    "check_compact_after",
    "check_compact_before",
    "check_prepare_after",
    "check_prepare_before",
    "hook_blocks",
    "summary_after_hook",
    "summary_hook",
]

# Every block a hook adds is named ``hook:<name>:<digest>``: no ledger position, unlike other blocks.
HOOK_BLOCK_PREFIX = "hook:"
# The code a refused change is reported with (diagnostics, metrics outcome ``refused``).
HOOK_REFUSED = "hook_change_refused"
# Blocks no hook may deselect whatever their retention: they are who the agent is and what it does.
_UNTOUCHABLE = (BlockKind.INSTRUCTION, BlockKind.TASK, BlockKind.STATE, BlockKind.SUMMARY)
# Never change: addition block ids computed under it name hook material in stored contexts.
_ADDITION_NS = uuid.UUID("b1f0c7e2-5a0d-5e1b-8f3c-6c7466c6c019")


@dataclass(frozen=True, slots=True)
class PrepareHookChange:
    """What prepare.before hooks changed, as the assembler applies it."""

    additions: tuple[DraftBlock, ...] = ()
    deselected: frozenset[str] = frozenset()

    def apply(self, ordered: Sequence[DraftBlock]) -> list[DraftBlock]:
        """The candidates minus the deselected blocks, with the additions where other material goes:
        after the stable prefix (the newest volatile part), before the state projection."""
        kept = [b for b in ordered if b.block_id not in self.deselected]
        at = len(kept)
        while at > 0 and kept[at - 1].kind is BlockKind.STATE:
            at -= 1
        return [*kept[:at], *self.additions, *kept[at:]]


def hook_blocks(ordered: Sequence[DraftBlock], tokens: Mapping[str, int]) -> tuple[HookBlock, ...]:
    return tuple(
        HookBlock(
            block_id=b.block_id,
            kind=b.kind,
            retention=b.retention,
            tokens=tokens.get(b.block_id, 0),
            text="\n".join(m.content or "" for m in b.messages),
        )
        for b in ordered
    )


def _foreign(patch: HookPatch, allowed: frozenset[str]) -> list[str]:
    """Fields of ``patch`` set although its point does not allow them."""
    present = {
        "add": bool(patch.add),
        "deselect": bool(patch.deselect),
        "edit": bool(patch.edit),
        "annotations": bool(patch.annotations),
        "narrow_to": patch.narrow_to is not None,
        "summary_target_tokens": patch.summary_target_tokens is not None,
        "summary_fields": patch.summary_fields is not None,
    }
    return [
        f"{name} is not allowed at this point" for name, on in present.items() if on and name not in allowed
    ]


def check_prepare_before(
    binding: HookBinding, patch: HookPatch, candidates: Sequence[HookBlock]
) -> list[str]:
    """Why ``patch`` may not be applied to the candidates (empty: it may)."""
    problems = _foreign(patch, frozenset({"add", "deselect", "edit"}))  # edits: named below
    problems += [
        f"edit of block {e.block_id}: a hook may add material or deselect optional blocks, never "
        "change a block's text"
        for e in patch.edit
    ]
    by_id = {b.block_id: b for b in candidates}
    for block_id in patch.deselect:
        block = by_id.get(block_id)
        if block is None:
            problems.append(f"deselect of {block_id}: no such candidate block")
        elif block.retention is Retention.REQUIRED or block.kind in _UNTOUCHABLE:
            problems.append(f"deselect of {block_id}: a {block.retention.value} {block.kind.value} block")
    problems += [
        f"addition {a.title!r}: category {a.category.value} is not granted to {binding.source}"
        for a in patch.add
        if a.category not in binding.grants
    ]
    return problems


def addition_blocks(binding: HookBinding, patch: HookPatch) -> tuple[DraftBlock, ...]:
    """A checked patch's additions as optional material, labelled with the hook's source."""
    out: list[DraftBlock] = []
    for i, a in enumerate(patch.add):
        digest = uuid.uuid5(_ADDITION_NS, f"{binding.source}\x00{i}\x00{a.category.value}\x00{a.text}")
        # Guidance is the least of all: dropped first when the budget is short.
        out.append(
            user_block(
                f"{HOOK_BLOCK_PREFIX}{binding.name}:{digest.hex[:12]}",
                BlockKind.MATERIAL,
                Retention.COMPRESSIBLE,
                3,
                f"{a.category.value} added by hook {binding.source}: {a.title}",
                f"[{a.category.value} from {binding.source}: {a.title}]\n{a.text}",
            )
        )
    return tuple(out)


def check_prepare_after(patch: HookPatch) -> list[str]:
    """A prepare.after hook is read-only: it may annotate the diagnostics, nothing else."""
    return _foreign(patch, frozenset({"annotations"}))


def check_compact_before(patch: HookPatch, candidate: HookRange, target_tokens: int) -> list[str]:
    """A compact.before hook may narrow the range (never widen it) and adjust the summary target."""
    problems = _foreign(patch, frozenset({"narrow_to", "summary_target_tokens"}))
    narrow = patch.narrow_to
    if narrow is not None and not (
        candidate.from_seq <= narrow.from_seq <= narrow.to_seq <= candidate.to_seq
    ):
        problems.append(
            f"narrow_to {narrow.from_seq}–{narrow.to_seq} is not inside the candidate range "
            f"{candidate.from_seq}–{candidate.to_seq}"
        )
    if patch.summary_target_tokens is not None and patch.summary_target_tokens > target_tokens:
        # A larger summary than the policy's share would eat the budget the compaction frees.
        problems.append(
            f"summary_target_tokens {patch.summary_target_tokens} exceeds the policy's {target_tokens}"
        )
    return problems


def check_compact_after(patch: HookPatch) -> list[str]:
    """A compact.after hook may replace the summary's allowed text fields only."""
    problems = _foreign(patch, frozenset({"summary_fields"}))
    fields = patch.summary_fields or {}
    problems += [
        f"summary field {name} may not be patched"
        for name in sorted(fields)
        if name not in SUMMARY_PATCH_FIELDS
    ]
    return problems


def summary_after_hook(
    summary: StructuredSummary, fields: Mapping[str, JsonValue]
) -> tuple[StructuredSummary | None, list[str]]:
    """The candidate summary with a checked patch's fields, or why it is no summary.

    The result still has to pass the compaction's own validation (files, failures, actions …); here
    only what the validator does not see: the release's constraints may be added to, never dropped.
    """
    merged = summary.model_dump(mode="json") | dict(fields)
    try:
        patched = StructuredSummary.model_validate(merged)
    except ValidationError as exc:
        return None, [f"patched summary is malformed: {exc.error_count()} error(s)"]
    kept = {c.text for c in patched.constraints}
    dropped = [c.text for c in summary.constraints if c.text not in kept]
    if dropped:
        return None, [f"patch drops constraint {t!r}" for t in dropped]
    return patched, []


def summary_hook(binding: HookBinding, release: str, revision: int, change: str) -> SummaryHook:
    """How a compaction hook that narrowed or patched a summary is recorded with it."""
    point: Literal["context.compact.before", "context.compact.after"]
    match binding.point:
        case HookPoint.COMPACT_BEFORE:
            point = "context.compact.before"
        case HookPoint.COMPACT_AFTER:
            point = "context.compact.after"
        case HookPoint.PREPARE_BEFORE | HookPoint.PREPARE_AFTER:
            raise ValueError(f"a {binding.point.value} hook does not shape a summary")
        case _:
            assert_never(binding.point)
    return SummaryHook(
        source=binding.source,
        point=point,
        subject=binding.subject,
        release=release,
        hook_set_revision=revision,
        change=change,
    )
