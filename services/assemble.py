"""Assembly: the prepared context of a thread from its records, request and budget. Pure.

Same records, request and budget → byte-identical reply: no clock, no randomness, no set
iteration; ids are UUIDv5 of the inputs. Stable parts come first (instructions, then history in
ledger order), so consecutive prepares share the longest possible prompt prefix (seed 002).

Budget (seed 000 §5.4, DESIGN.md rule 5): required blocks (instructions, the current request, the
tool schemas) must fit or the prepare fails with ``ContextBudgetExceeded`` and itemized sizes.
Anything else that does not fit is left out whole — lowest priority, then oldest, first — and
listed in ``omitted`` with the reason; until compaction exists that is the only fallback.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from contracts import (
    BlockKind,
    BudgetCategory,
    BudgetReport,
    ChatMessage,
    ContextBlock,
    OmittedBlock,
    PreparedContext,
    PrepareRequest,
    Purpose,
    SourceWatermark,
    ToolSchema,
)

from .budget import BudgetSpec
from .errors import BlockSize, ContextBudgetExceeded
from .groups import DraftBlock, build_blocks
from .hashing import canonical_json
from .records import LedgerRecord
from .render import MESSAGE_OVERHEAD, REPLY_PRIMING, TOOL_SCHEMA_OVERHEAD, tool_schema_text
from .tokens import ESTIMATE_METHOD, EncodingName, TokenCounter, estimate_tokens

__all__ = ["ASSEMBLY_REVISION", "ThreadSnapshot", "assemble_context"]

# Bump whenever the selection or rendering rules change: replies are versioned by it.
ASSEMBLY_REVISION = "assembly-1"
# Never change: prepared ids computed under it are referenced by stored reports and dumps.
_PREPARED_NS = uuid.UUID("5d7a4f0e-2f7c-5b1e-9a55-6c7466c6c001")

_CATEGORY = {
    BlockKind.INSTRUCTION: "instructions",
    BlockKind.TASK: "history",
    BlockKind.INTERACTION: "history",
    BlockKind.STATE: "history",
    BlockKind.MATERIAL: "materials",
    BlockKind.SUMMARY: "summaries",
}


@dataclass(frozen=True, slots=True)
class ThreadSnapshot:
    """A thread's head and all its records up to that head."""

    session_id: str
    run_id: str
    instance_id: str
    revision: int
    last_seq: int
    last_event_key: str | None
    records: Sequence[LedgerRecord]


@dataclass(frozen=True, slots=True)
class _Sized:
    block: DraftBlock
    content: int
    envelope: int

    @property
    def total(self) -> int:
        return self.content + self.envelope


def assemble_context(
    snapshot: ThreadSnapshot,
    request: PrepareRequest,
    budget: BudgetSpec,
    counter: TokenCounter | None,
) -> PreparedContext:
    """The prepared context; ``counter`` is ``None`` when the profile asks for the bytes/4 estimate."""
    ready, held, pending = build_blocks(snapshot.records)
    sized = [_size(b, budget.encoding, counter) for b in ready]
    tools = () if request.purpose is Purpose.COMPACTION else request.tools
    schema_tokens = _tool_tokens(tools, counter)

    required = [s for s in sized if not s.block.droppable]
    required_total = sum(s.total for s in required) + schema_tokens + REPLY_PRIMING
    if required_total > budget.input_budget:
        raise ContextBudgetExceeded(required_total, budget.input_budget, _items(required, schema_tokens))

    kept, dropped = _fit(sized, budget.input_budget - required_total)
    blocks, messages = _emit(kept)
    used = _usage(kept, schema_tokens)
    omitted = [_omitted(s, "over budget with no summary yet: left out whole (lowest priority, oldest first)") for s in dropped]
    omitted += [_omitted(_size(b, budget.encoding, counter), b.reason) for b in held]
    omitted.sort(key=lambda o: (_first_seq(o.block_id), o.block_id))
    return PreparedContext(
        prepared_id=_prepared_id(snapshot, request, budget),
        session_id=snapshot.session_id,
        run_id=snapshot.run_id,
        instance_id=snapshot.instance_id,
        purpose=request.purpose,
        assembly_revision=ASSEMBLY_REVISION,
        source_watermark=SourceWatermark(
            thread_seq=snapshot.last_seq, head_revision=snapshot.revision, last_event_key=snapshot.last_event_key
        ),
        messages=tuple(messages),
        tools=tools,
        blocks=tuple(blocks),
        omitted=tuple(omitted),
        pending_calls=tuple(pending),
        budget_report=BudgetReport(
            profile=budget.profile,
            context_window=budget.context_window,
            input_limit=budget.input_limit,
            output_reserve=budget.output_reserve,
            safety_margin=budget.safety_margin,
            input_budget=budget.input_budget,
            used=used,
            remaining=budget.input_budget - used.total,
            counting_method=counter.method if counter else ESTIMATE_METHOD,
            estimated=counter is None,
        ),
    )


def _size(block: DraftBlock, encoding: str, counter: TokenCounter | None) -> _Sized:
    if counter is None:
        content = sum(estimate_tokens(m.model_dump_json(exclude_none=True)) for m in block.messages)
    else:
        enc: EncodingName = counter.name
        content = sum(r.tokens.get(enc) for r in block.records)
    return _Sized(block, content, MESSAGE_OVERHEAD * len(block.messages))


def _tool_tokens(tools: Sequence[ToolSchema], counter: TokenCounter | None) -> int:
    total = 0
    for tool in tools:
        text = tool_schema_text(tool.name, tool.description, tool.parameters)
        total += (counter.count(text) if counter else estimate_tokens(text)) + TOOL_SCHEMA_OVERHEAD
    return total


def _items(required: Sequence[_Sized], schema_tokens: int) -> list[BlockSize]:
    items: list[BlockSize] = [
        {"block_id": s.block.block_id, "kind": s.block.kind.value, "tokens": s.total} for s in required
    ]
    items.append({"block_id": "tool_schemas", "kind": "tool_schemas", "tokens": schema_tokens})
    items.append({"block_id": "reply_priming", "kind": "envelope", "tokens": REPLY_PRIMING})
    return items


def _fit(sized: Sequence[_Sized], room: int) -> tuple[list[_Sized], list[_Sized]]:
    """Keep every droppable block that fits, dropping lowest priority, then oldest, first."""
    optional = [s for s in sized if s.block.droppable]
    need = sum(s.total for s in optional) - room
    dropped_ids: set[str] = set()
    dropped: list[_Sized] = []
    if need > 0:
        for s in sorted(optional, key=lambda s: (-s.block.priority, _first_seq(s.block.block_id))):
            if need <= 0:
                break
            dropped_ids.add(s.block.block_id)
            dropped.append(s)
            need -= s.total
    kept = [s for s in sized if s.block.block_id not in dropped_ids]
    return kept, dropped


def _first_seq(block_id: str) -> int:
    return int(block_id.rsplit(":", 1)[1])


def _emit(kept: Sequence[_Sized]) -> tuple[list[ContextBlock], list[ChatMessage]]:
    blocks: list[ContextBlock] = []
    messages: list[ChatMessage] = []
    for s in kept:
        b = s.block
        blocks.append(
            ContextBlock(
                block_id=b.block_id,
                kind=b.kind,
                retention=b.retention,
                priority=b.priority,
                droppable=b.droppable,
                reason=b.reason,
                sources=b.sources,
                first_message=len(messages),
                message_count=len(b.messages),
                tokens=s.total,
            )
        )
        messages.extend(b.messages)
    return blocks, messages


def _usage(kept: Sequence[_Sized], schema_tokens: int) -> BudgetCategory:
    by: dict[str, int] = {"instructions": 0, "history": 0, "materials": 0, "summaries": 0}
    envelopes = REPLY_PRIMING
    for s in kept:
        by[_CATEGORY[s.block.kind]] += s.content
        envelopes += s.envelope
    total = sum(by.values()) + envelopes + schema_tokens
    return BudgetCategory(tool_schemas=schema_tokens, envelopes=envelopes, total=total, **by)


def _omitted(s: _Sized, reason: str) -> OmittedBlock:
    return OmittedBlock(block_id=s.block.block_id, kind=s.block.kind, reason=reason, sources=s.block.sources, tokens=s.total)


def _prepared_id(snapshot: ThreadSnapshot, request: PrepareRequest, budget: BudgetSpec) -> str:
    # wait_ms and the watermark only decide when to answer, not what: they are not part of the id.
    fingerprint: dict[str, JsonValue] = {
        "request": request.model_dump(mode="json", exclude={"wait_ms", "after_event_key"}),
        "thread": f"{snapshot.run_id}.{snapshot.instance_id}",
        "revision": snapshot.revision,
        "budget": budget.input_budget,
        "assembly": ASSEMBLY_REVISION,
    }
    return str(uuid.uuid5(_PREPARED_NS, canonical_json(fingerprint).decode()))
