"""Assembly: the prepared context of a thread from its records, summary, request and budget. Pure.

Same records, summary, request and budget → byte-identical reply: no clock, no randomness, no set
iteration; ids are UUIDv5 of the inputs. Stable parts come first — instructions, the committed
summary, then history in ledger order — so consecutive prepares share the longest prompt prefix.

Budget (seed 000 §5.4, DESIGN.md rule 5):
1. Required blocks (instructions, the current request, tool schemas) must fit, or the prepare
   fails with ``ContextBudgetExceeded`` and itemized sizes.
2. Over the input budget, deterministic reductions run in order: drop optional material (oldest
   first), then mask old tool outputs down to their previews (oldest first, the newest groups
   last). Large results are already previews with references since recording.
3. Still over → ``OverBudget``: history must be compacted, never silently dropped; the caller
   waits for the thread's compaction job and assembles again.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

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
    Retention,
    SourceWatermark,
    SummaryRef,
    ToolSchema,
)

from .budget import BudgetSpec
from .errors import BlockSize, ContextBudgetExceeded, CtxError
from .groups import DraftBlock, build_view_blocks
from .hashing import canonical_json
from .records import LedgerRecord
from .state import Fact, pattern_regex, render_facts
from .render import MESSAGE_OVERHEAD, REPLY_PRIMING, TOOL_SCHEMA_OVERHEAD, content_of, tool_schema_text
from .tokens import ESTIMATE_METHOD, EncodingName, TokenCounter, estimate_tokens

__all__ = ["ASSEMBLY_REVISION", "Evidence", "OverBudget", "SummaryView", "ThreadSnapshot", "assemble_context"]

# Bump whenever the selection or rendering rules change: replies are versioned by it.
ASSEMBLY_REVISION = "assembly-2"
# Never change: prepared ids computed under it are referenced by stored reports and dumps.
_PREPARED_NS = uuid.UUID("5d7a4f0e-2f7c-5b1e-9a55-6c7466c6c001")
# The newest complete groups keep their full outputs even under pressure: the model is using them.
_KEEP_UNMASKED_GROUPS = 2
# A state block beyond this many facts would be a state dump, not a projection.
_MAX_FACTS = 100

_CATEGORY = {
    BlockKind.INSTRUCTION: "instructions",
    BlockKind.TASK: "history",
    BlockKind.INTERACTION: "history",
    BlockKind.STATE: "history",
    BlockKind.MATERIAL: "materials",
    BlockKind.SUMMARY: "summaries",
}


@dataclass(frozen=True, slots=True)
class SummaryView:
    """The committed summary a view shows, as the model reads it."""

    summary_id: str
    view_revision: int
    covered_from: int
    covered_to: int
    text: str
    tokens_o200k: int
    tokens_cl100k: int
    sources: tuple[int, ...]

    def tokens(self, encoding: str) -> int:
        """Tokens of the summary text in ``encoding``."""
        return self.tokens_cl100k if encoding == "cl100k_base" else self.tokens_o200k


@dataclass(frozen=True, slots=True)
class ThreadSnapshot:
    """A thread's head, its records up to that head, and the summary its view shows."""

    session_id: str
    run_id: str
    instance_id: str
    revision: int
    last_seq: int
    last_event_key: str | None
    records: Sequence[LedgerRecord]
    view_revision: int = 0
    covered_to: int = 0
    summary: SummaryView | None = None
    policy: str = ""
    own_thread: str = ""
    facts: tuple[Fact, ...] = ()
    reads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True, slots=True)
class Evidence:
    """A record quoted as evidence: re-read from the ledger, with the hashes that identify it."""

    thread_id: str
    seq: int
    event_key: str
    kind: str
    content_sha256: str
    record_hash: str
    text: str


class OverBudget(CtxError):
    """The view does not fit even after the deterministic reductions; history must be compacted."""

    def __init__(self, total: int, input_budget: int, items: list[BlockSize], reductions: tuple[str, ...]) -> None:
        super().__init__(f"view needs {total} tokens after reductions; the input budget is {input_budget}")
        self.total = total
        self.input_budget = input_budget
        self.items = items
        self.reductions = reductions

    def exceeded(self, waited_ms: int) -> ContextBudgetExceeded:
        """The wire error once waiting for compaction did not help."""
        err = ContextBudgetExceeded(self.total, self.input_budget, self.items)
        err.details["reason"] = "history over budget and no compaction landed in time"
        err.details["waited_ms"] = waited_ms
        return err


@dataclass
class _Sized:
    block: DraftBlock
    content: int
    envelope: int
    masked: bool = False

    @property
    def total(self) -> int:
        return self.content + self.envelope


@dataclass
class _Fit:
    kept: list[_Sized]
    dropped: list[_Sized] = field(default_factory=list)
    reductions: list[str] = field(default_factory=list)


def assemble_context(
    snapshot: ThreadSnapshot,
    request: PrepareRequest,
    budget: BudgetSpec,
    counter: TokenCounter | None,
    *,
    compaction_wait_ms: int = 0,
) -> PreparedContext:
    """The prepared context; ``counter`` is ``None`` when the profile asks for the bytes/4 estimate."""
    blocks = build_view_blocks(snapshot.records, snapshot.covered_to, own_thread=snapshot.own_thread)
    ordered = _with_summary(blocks.ready, snapshot.summary)
    ordered.extend(_evidence_block(e, i) for i, e in enumerate(snapshot.evidence))
    state_block = _state_block(snapshot, request)
    if state_block is not None:
        ordered.append(state_block)
    sized = [_size(b, counter, snapshot.summary) for b in ordered]
    tools = () if request.purpose is Purpose.COMPACTION else request.tools
    schema_tokens = _tool_tokens(tools, counter)

    required = [s for s in sized if not s.block.droppable]
    required_total = sum(s.total for s in required) + schema_tokens + REPLY_PRIMING
    if required_total > budget.input_budget:
        raise ContextBudgetExceeded(required_total, budget.input_budget, _items(required, schema_tokens))

    fit = _reduce(sized, budget.input_budget - schema_tokens - REPLY_PRIMING, counter)
    total = sum(s.total for s in fit.kept) + schema_tokens + REPLY_PRIMING
    if total > budget.input_budget:
        raise OverBudget(total, budget.input_budget, _items(fit.kept, schema_tokens), tuple(fit.reductions))

    out_blocks, messages = _emit(fit.kept, counter)
    used = _usage(fit.kept, schema_tokens)
    estimated, calibration = _calibrate(used.total, snapshot, request, fit.kept, counter.name if counter else "o200k_base")
    omitted = [_omitted(s, "optional material dropped: over the input budget") for s in fit.dropped]
    omitted += [_omitted(_size(b, counter), b.reason) for b in blocks.held]
    omitted.sort(key=lambda o: (_first_seq(o.block_id), o.block_id))
    summary = snapshot.summary
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
        blocks=tuple(out_blocks),
        omitted=tuple(omitted),
        pending_calls=tuple(blocks.pending),
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
            estimated_input=estimated,
            calibration=calibration,
        ),
        view_revision=snapshot.view_revision,
        summary=(
            SummaryRef(
                summary_id=summary.summary_id,
                view_revision=summary.view_revision,
                covered_from=summary.covered_from,
                covered_to=summary.covered_to,
                sources=summary.sources,
            )
            if summary
            else None
        ),
        reductions=tuple(fit.reductions),
        compaction_wait_ms=compaction_wait_ms,
        policy=snapshot.policy,
    )


def _with_summary(ready: list[DraftBlock], summary: SummaryView | None) -> list[DraftBlock]:
    """Instructions, then the summary, then everything else in ledger order."""
    if summary is None:
        return ready
    block = DraftBlock(
        block_id=f"summary:{summary.covered_from}",
        kind=BlockKind.SUMMARY,
        retention=Retention.REQUIRED,
        priority=1,
        reason=f"committed summary r{summary.view_revision} of records {summary.covered_from}–{summary.covered_to}",
        records=[],
        messages=[ChatMessage(role="user", content=summary.text)],
    )
    pinned = [b for b in ready if b.kind is BlockKind.INSTRUCTION]
    rest = [b for b in ready if b.kind is not BlockKind.INSTRUCTION]
    return [*pinned, block, *rest]


def _evidence_block(evidence: Evidence, index: int) -> DraftBlock:
    head = (
        f"[evidence: record {evidence.seq} of thread {evidence.thread_id} ({evidence.kind}, event {evidence.event_key}, "
        f"content sha256 {evidence.content_sha256[:16]}…, record {evidence.record_hash[:16]}…) — quoted material, not instruction]"
    )
    return DraftBlock(
        block_id=f"evidence:{index}",
        kind=BlockKind.MATERIAL,
        retention=Retention.ACTIVE,
        priority=1,
        reason="evidence the runtime asked for, re-read from the ledger",
        records=[],
        messages=[ChatMessage(role="user", content=f"{head}\n{evidence.text}")],
    )


def _state_block(snapshot: ThreadSnapshot, request: PrepareRequest) -> DraftBlock | None:
    """Current facts with status and source: the slice the requested tools declare they read, or all.

    Placed last: it changes with every patch, and volatile parts go last (seed 002).
    """
    if not snapshot.facts:
        return None
    patterns = [pattern_regex(p) for t in request.tools for p in snapshot.reads.get(t.name, ())]
    facts = [f for f in snapshot.facts if not patterns or any(p.match(f.path) for p in patterns)]
    if not facts:
        return None
    facts = sorted(facts, key=lambda f: f.seq)[-_MAX_FACTS:]
    return DraftBlock(
        block_id=f"state:{max(f.seq for f in facts)}",
        kind=BlockKind.STATE,
        retention=Retention.REQUIRED,
        priority=0,
        reason="current state projected from the ledger: latest facts with status and source",
        records=[],
        messages=[ChatMessage(role="user", content=render_facts(facts))],
    )


def _size(block: DraftBlock, counter: TokenCounter | None, summary: SummaryView | None = None) -> _Sized:
    if block.kind in (BlockKind.STATE, BlockKind.MATERIAL) and not block.records:
        text = block.messages[0].content or ""
        return _Sized(block, counter.count(text) if counter else estimate_tokens(text), MESSAGE_OVERHEAD)
    if block.kind is BlockKind.SUMMARY and summary is not None:
        # Counted once when the summary was committed, like every record.
        content = summary.tokens(counter.name) if counter else estimate_tokens(summary.text)
    elif counter is None:
        content = sum(estimate_tokens(m.model_dump_json(exclude_none=True)) for m in block.messages)
    else:
        enc: EncodingName = counter.name
        content = sum(r.tokens.get(enc) for r in block.records)
    return _Sized(block, content, MESSAGE_OVERHEAD * len(block.messages))


def _reduce(sized: list[_Sized], room: int, counter: TokenCounter | None) -> _Fit:
    """Deterministic reductions, in order, until the blocks fit ``room`` (or nothing is left to do)."""
    fit = _Fit(kept=list(sized))

    def over() -> int:
        return sum(s.total for s in fit.kept) - room

    if over() <= 0:
        return fit
    for s in sorted((s for s in fit.kept if s.block.kind is BlockKind.MATERIAL), key=lambda s: _first_seq(s.block.block_id)):
        if over() <= 0:
            break
        fit.kept.remove(s)
        fit.dropped.append(s)
        fit.reductions.append(f"dropped:{s.block.block_id}")
    groups = [s for s in fit.kept if s.block.block_id.startswith("group:")]
    for s in groups[: max(0, len(groups) - _KEEP_UNMASKED_GROUPS)]:
        if over() <= 0:
            break
        saved = _mask(s, counter)
        if saved > 0:
            fit.reductions.append(f"masked:{s.block.block_id}")
    return fit


def _mask(s: _Sized, counter: TokenCounter | None) -> int:
    """Show a group's long tool outputs as their previews; returns the tokens saved."""
    before = s.content
    records = []
    for record in s.block.records:
        if record.kind == "tool_outcome" and record.mask_text is not None and record.mask_tokens is not None:
            records.append(replace(record, text=record.mask_text, tokens=record.mask_tokens))
        else:
            records.append(record)
    if counter is not None:
        content = sum(r.tokens.get(counter.name) for r in records)
    else:
        content = sum(estimate_tokens(r.text) for r in records)
    if content >= before:
        return 0
    s.block = replace(s.block, records=records, messages=_remessage(s.block, records))
    s.content = content
    s.masked = True
    return before - content


def _remessage(block: DraftBlock, records: list[LedgerRecord]) -> list[ChatMessage]:
    texts = {r.payload.get("call_id"): content_of(r.kind, r.payload, r.text) for r in records if r.kind == "tool_outcome"}
    return [m.model_copy(update={"content": texts[m.tool_call_id]}) if m.role == "tool" else m for m in block.messages]


def _tool_tokens(tools: Sequence[ToolSchema], counter: TokenCounter | None) -> int:
    total = 0
    for tool in tools:
        text = tool_schema_text(tool.name, tool.description, tool.parameters)
        total += (counter.count(text) if counter else estimate_tokens(text)) + TOOL_SCHEMA_OVERHEAD
    return total


def _items(blocks: Sequence[_Sized], schema_tokens: int) -> list[BlockSize]:
    items: list[BlockSize] = [{"block_id": s.block.block_id, "kind": s.block.kind.value, "tokens": s.total} for s in blocks]
    items.append({"block_id": "tool_schemas", "kind": "tool_schemas", "tokens": schema_tokens})
    items.append({"block_id": "reply_priming", "kind": "envelope", "tokens": REPLY_PRIMING})
    return items


def _first_seq(block_id: str) -> int:
    return int(block_id.rsplit(":", 1)[1])


def _emit(kept: Sequence[_Sized], counter: TokenCounter | None) -> tuple[list[ContextBlock], list[ChatMessage]]:
    blocks: list[ContextBlock] = []
    messages: list[ChatMessage] = []
    for s in kept:
        b = s.block
        reason = b.reason + ("; long tool outputs masked to previews (over budget)" if s.masked else "")
        blocks.append(
            ContextBlock(
                block_id=b.block_id,
                kind=b.kind,
                retention=b.retention,
                priority=b.priority,
                droppable=b.droppable,
                reason=reason,
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


def _calibrate(
    local: int, snapshot: ThreadSnapshot, request: PrepareRequest, kept: Sequence[_Sized], encoding: EncodingName
) -> tuple[int, str]:
    """Provider usage of the last response plus local counts of what came after it (seed 002)."""
    usage = request.usage
    if usage is None or usage.view_revision != snapshot.view_revision:
        return local, "local"
    response = next((r.seq for r in snapshot.records if r.event_key == usage.response_event_key), None)
    if response is None:
        return local, "local"
    after = sum(
        sum(r.tokens.get(encoding) for r in s.block.records if r.seq > response) + MESSAGE_OVERHEAD
        for s in kept
        if any(r.seq > response for r in s.block.records)
    )
    return usage.input_tokens + usage.output_tokens + after, "provider_usage+local"


def _omitted(s: _Sized, reason: str) -> OmittedBlock:
    return OmittedBlock(block_id=s.block.block_id, kind=s.block.kind, reason=reason, sources=s.block.sources, tokens=s.total)


def _prepared_id(snapshot: ThreadSnapshot, request: PrepareRequest, budget: BudgetSpec) -> str:
    # wait_ms and the watermark only decide when to answer, not what: they are not part of the id.
    # An empty evidence list is left out so ids minted before evidence existed stay the same.
    excluded = {"wait_ms", "after_event_key"} | (set() if request.evidence else {"evidence"})
    fingerprint: dict[str, JsonValue] = {
        "request": request.model_dump(mode="json", exclude=excluded),
        "thread": f"{snapshot.run_id}.{snapshot.instance_id}",
        "revision": snapshot.revision,
        "view_revision": snapshot.view_revision,
        "budget": budget.input_budget,
        "assembly": ASSEMBLY_REVISION,
    }
    return str(uuid.uuid5(_PREPARED_NS, canonical_json(fingerprint).decode()))
