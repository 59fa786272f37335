"""What the fleet answered, step by step: a served context's manifest, its blocks' texts, and diffs. Pure.

A served context is kept as a manifest (its blocks, their sources, tokens and a digest of what each
block put in front of the model) beside the texts of its blocks, each stored once per thread under its
digest: a block a hundred steps keep in view is stored once, so a thread's served texts grow with
what it ever showed, not with the number of steps.

A diff says, per block, what changed between two served contexts of one thread and why, from a
closed set of reasons (:data:`ChangeReason`). Invariants of :func:`diff_served`:

1. Every block of either context is named once: kept (same id, same digest, not listed), added,
   removed, or changed (same id, another digest).
2. The stable prefix is the leading run of blocks both contexts show byte-identical and in the
   same order: what a provider's prompt cache can reuse from the previous step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, assert_never

from pydantic import BaseModel, ConfigDict

from contracts import BudgetCategory, PreparedContext, RequestFormat, SummaryRef
from services.core.block_text import block_text
from services.core.hashing import sha256_hex

__all__ = [
    "BlockChange",
    "ChangeReason",
    "ServedBlock",
    "ServedContext",
    "ServedDiff",
    "change_symbol",
    "diff_served",
    "served_of",
]

# Why a block differs from the previous step.
ChangeReason = Literal["first", "new_records", "compaction", "reduction", "rollover", "hook", "reassembled"]


class ServedBlock(BaseModel):
    """A block of a served context: what it is, why it is there, and the digest of its text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_id: str
    kind: str
    retention: str
    reason: str
    sources: tuple[int, ...]
    tokens: int
    digest: str


class ServedContext(BaseModel):
    """The manifest of one context the fleet answered (never its content: see the texts)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prepared_id: str
    format: RequestFormat
    tenant: str
    session_id: str
    thread_id: str
    purpose: str
    policy: str
    view_revision: int
    window: int
    rollover: bool
    summary: SummaryRef | None
    reductions: tuple[str, ...]
    hooks: tuple[str, ...]
    # The last record it looked at (``source_watermark.thread_seq``).
    thread_seq: int
    input_budget: int
    used: BudgetCategory
    level: str | None
    blocks: tuple[ServedBlock, ...]
    omitted: int


def served_of(prepared: PreparedContext, tenant: str) -> tuple[ServedContext, dict[str, str]]:
    texts: dict[str, str] = {}
    blocks: list[ServedBlock] = []
    for b in prepared.blocks:
        text = block_text(prepared, b).text
        digest = sha256_hex(text.encode())
        texts[digest] = text
        blocks.append(
            ServedBlock(
                block_id=b.block_id,
                kind=b.kind.value,
                retention=b.retention.value,
                reason=b.reason,
                sources=tuple(s.seq for s in b.sources),
                tokens=b.tokens,
                digest=digest,
            )
        )
    report = prepared.window_report
    served = ServedContext(
        prepared_id=prepared.prepared_id,
        format=prepared.format,
        tenant=tenant,
        session_id=prepared.session_id,
        thread_id=f"{prepared.run_id}.{prepared.instance_id}",
        purpose=prepared.purpose.value,
        policy=prepared.policy,
        view_revision=prepared.view_revision,
        window=prepared.window,
        rollover=prepared.rollover is not None,
        summary=prepared.summary,
        reductions=prepared.reductions,
        hooks=tuple(f"{h.source}: {h.outcome}" for h in prepared.hooks),
        thread_seq=prepared.source_watermark.thread_seq,
        input_budget=prepared.budget_report.input_budget,
        used=prepared.budget_report.used,
        level=None if report is None else report.level.value,
        blocks=tuple(blocks),
        omitted=len(prepared.omitted),
    )
    return served, texts


@dataclass(frozen=True, slots=True)
class BlockChange:
    """One block added, removed or changed since the previous step, and why."""

    change: Literal["added", "removed", "changed"]
    block: ServedBlock
    # The block as the previous step showed it (``changed`` only).
    before: ServedBlock | None
    reason: ChangeReason
    detail: str


@dataclass(frozen=True, slots=True)
class ServedDiff:
    """What changed from one served context to the next."""

    changes: tuple[BlockChange, ...]
    kept: int
    # Invariant 2: tokens and blocks of the leading run both show byte-identical.
    stable_prefix_tokens: int
    stable_prefix_blocks: int

    def counts(self) -> Mapping[str, int]:
        return {"added": 0, "removed": 0, "changed": 0} | Counter(c.change for c in self.changes)


def _stable_prefix(before: Sequence[ServedBlock], after: Sequence[ServedBlock]) -> tuple[int, int]:
    tokens = blocks = 0
    for old, new in zip(before, after, strict=False):
        if (old.block_id, old.digest) != (new.block_id, new.digest):
            break
        tokens += new.tokens
        blocks += 1
    return tokens, blocks


def _reason(
    change: Literal["added", "removed", "changed"],
    block: ServedBlock,
    before: ServedContext,
    after: ServedContext,
) -> tuple[ChangeReason, str]:
    """The first of: rollover, new records (a block of them), compaction, reduction, hook; else reassembly."""
    if after.window != before.window:
        return "rollover", f"window {before.window} → {after.window}"
    if change == "added" and any(s > before.thread_seq for s in block.sources):
        return "new_records", f"records #{before.thread_seq + 1}–#{after.thread_seq}"
    if after.view_revision != before.view_revision:
        covered = after.summary
        if change == "removed" and covered is not None and block.sources:
            if all(covered.covered_from <= s <= covered.covered_to for s in block.sources):
                span = f"#{covered.covered_from}–#{covered.covered_to}"
                return "compaction", f"compaction {after.view_revision}: summarized ({span})"
        return (
            "compaction",
            f"compaction {after.view_revision} (view {before.view_revision} → {after.view_revision})",
        )
    if after.reductions or before.reductions:
        return "reduction", ", ".join(after.reductions or before.reductions)
    if after.hooks:
        return "hook", ", ".join(after.hooks)
    if after.thread_seq != before.thread_seq:
        return "new_records", f"records #{before.thread_seq + 1}–#{after.thread_seq}"
    return (
        "reassembled",
        f"{before.purpose} → {after.purpose}, budget {before.input_budget} → {after.input_budget}",
    )


def diff_served(before: ServedContext | None, after: ServedContext) -> ServedDiff:
    """Blocks added, removed and changed from ``before`` (the previous step, if any) to ``after``."""
    if before is None:
        changes = tuple(
            BlockChange("added", b, None, "first", "the thread's first served context") for b in after.blocks
        )
        return ServedDiff(changes, kept=0, stable_prefix_tokens=0, stable_prefix_blocks=0)
    old = {b.block_id: b for b in before.blocks}
    new_ids = {b.block_id for b in after.blocks}
    found: list[BlockChange] = []
    kept = 0
    for b in after.blocks:
        prior = old.get(b.block_id)
        kind: Literal["added", "changed"]
        if prior is None:
            kind = "added"
        elif prior.digest != b.digest:
            kind = "changed"
        else:
            kept += 1
            continue
        reason, detail = _reason(kind, b, before, after)
        found.append(BlockChange(kind, b, prior, reason, detail))
    for b in before.blocks:
        if b.block_id not in new_ids:
            reason, detail = _reason("removed", b, before, after)
            found.append(BlockChange("removed", b, None, reason, detail))
    tokens, blocks = _stable_prefix(before.blocks, after.blocks)
    return ServedDiff(tuple(found), kept=kept, stable_prefix_tokens=tokens, stable_prefix_blocks=blocks)


def change_symbol(change: Literal["added", "removed", "changed"]) -> str:
    """``+``, ``−`` or ``~``: how a diff line starts."""
    match change:
        case "added":
            return "+"
        case "removed":
            return "−"
        case "changed":
            return "~"
        case _:
            assert_never(change)
