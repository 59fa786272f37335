"""Assembly: the prepared context of a thread from its records, summary, request and budget. Pure.

Same records, summary, request and budget → byte-identical reply: no clock, no randomness, no set
iteration; ids are UUIDv5 of the inputs. Stable parts come first — instructions, the run's task,
the committed summary, then history in ledger order, volatile evidence and state last — so
consecutive prepares share the longest prompt prefix.

What the model always sees: instructions, the run's task (the question that started the run),
the current request, current state, the summary (or its skeleton) and the newest complete tool
group — its outputs cut to head + tail with a read-back note when they do not fit. Only when these,
at their smallest, exceed the budget does the prepare fail with ``ContextBudgetExceeded``.

Budget: everything sent is counted — message text, role framing, every tool call's id, name and
arguments, a tool message's call id, the tools array as the provider is sent it. Over the input
budget the reductions of docs/design.md ("The reduction order, and the hard limit") run in order, each
counted in the report:
1. dedup: a tool output byte-identical to one still in view becomes a one-line reference (always,
   so a context does not flip between both forms as pressure changes);
2. trim: the newest group's outputs are cut to the room left; the summary falls back to its
   skeleton when the full one does not fit next to the required blocks and the newest group;
3. drop optional material (oldest first), then mask tool outputs to their previews, oldest first
   in chunks, never the newest two groups (a failed output keeps its telling line);
4. still over → an ``OverBudgetView`` instead of a context: history must be compacted first. With
   ``allow_drop_history`` (after the compaction wait ran out) the oldest history is dropped instead,
   each block reported, and a note stands in its place with the failures only it still showed.
"""

from __future__ import annotations

from contracts import (
    AssistantMessagePayload,
    EventKind,
    ToolOutcomePayload,
)

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import assert_never

from pydantic import JsonValue

from contracts import (
    BlockKind,
    BudgetCategory,
    BudgetReport,
    ChatTool,
    ChatMessage,
    ContextBlock,
    GatewayAddition,
    OmittedBlock,
    PreparedContext,
    PrepareRequest,
    Purpose,
    Retention,
    SourceWatermark,
    SummaryHook,
    SummaryRef,
    ToolSchema,
)
from contracts.prepare import ReductionCounts
from contracts.windows import WindowHandoff, WindowPolicy, WindowStrategy

from services.core.budget import BudgetSpec
from services.core.calibration import scaled
from services.core.compaction.files import files_of_call
from services.core.compaction.region import summary_parts
from services.core.failures import Failure, failure_of
from services.core.context_tools import CONTEXT_TOOLS_NOTE, record_ref, with_context_tools
from services.core.forecast import step_growths
from services.core.water_levels import green_room, window_report
from services.core.providers.bundle import ContextBundle
from services.core.providers.shapes import provider_request
from services.core.protected import build_manifest
from contracts.exceptions import BlockSize, ContextBudgetExceeded, OverBudget
from services.core.hook_patches import HOOK_BLOCK_PREFIX
from services.core.groups import BlockSet, DraftBlock, build_view_blocks, id_tokens, user_block
from services.core.hook_patches import PrepareHookChange
from services.core.hashing import canonical_json
from services.core.records import LedgerRecord
from services.core.state import Fact, pattern_regex, render_facts
from services.core.render import (
    MESSAGE_OVERHEAD,
    REPLY_PRIMING,
    RenderedCall,
    arguments_json,
    count_rendered,
    TokenCounts,
    name_read_tool,
    read_back_ref,
    read_back_with_tool,
    record_content,
    trim_to_fit,
)
from services.core.request_tokens import tools_wire
from services.core.tokens import ESTIMATE_METHOD, EncodingName, TokenCounter, estimate_tokens
from services.core.windows.handoff import handoff_block

__all__ = [
    "ASSEMBLY_REVISION",
    "Assembly",
    "Evidence",
    "OverBudgetView",
    "SummaryView",
    "ThreadSnapshot",
    "added_tokens",
    "assemble_context",
    "assemble_view",
    "block_size",
    "candidate_blocks",
    "shown_blocks",
    "view_sizes",
]

# Bump whenever the selection or rendering rules change: replies are versioned by it.
ASSEMBLY_REVISION = "assembly-3"
# Never change: prepared ids computed under it are referenced by stored reports and dumps.
_PREPARED_NS = uuid.UUID("5d7a4f0e-2f7c-5b1e-9a55-6c7466c6c001")
# The newest complete groups keep their full outputs even under pressure: the model is using them.
_KEEP_UNMASKED_GROUPS = 2
# Masking goes oldest first, in chunks that each free at least 1/_MASK_CHUNK_DIVISOR of the budget.
# Chunk edges depend only on the old groups themselves, so as the thread grows the masked prefix
# only ever extends, and it extends rarely: between two moves every context repeats the previous
# one as its prefix (cache reuse). Masking "one more group until it fits" would change the context
# at its oldest unmasked group on nearly every prepare. The last resort masks all but the newest two.
_MASK_CHUNK_DIVISOR = 2
# The smallest an output of the newest group is cut to (the read-back marker takes ~60 of them).
_MIN_OUTPUT_TOKENS = 96
# The smallest a long argument of the newest group's calls is cut to (a heredoc, a file's content).
_MIN_ARG_TOKENS = 96
# Each entry of the tools array also costs its separator and a share of the array's framing.
_TOOL_ENTRY_OVERHEAD = 2
# Outputs shorter than this are shown again rather than as a reference to an identical one.
_MIN_DEDUP_TOKENS = 32
# A note where history was left out names at most this many failures, and files of each kind.
_GAP_FAILURES = 5
_GAP_FILES = 30
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
    # The summary's smallest roll-up, shown when the full text does not fit.
    skeleton_text: str | None = None
    skeleton_o200k: int = 0
    skeleton_cl100k: int = 0
    # The hooks that narrowed or patched it, shown with it.
    hooks: tuple[SummaryHook, ...] = ()

    def tokens(self, encoding: str) -> int:
        """Tokens of the summary text in ``encoding``."""
        return self.tokens_cl100k if encoding == "cl100k_base" else self.tokens_o200k

    def skeleton_tokens(self, encoding: str) -> int:
        """Tokens of the skeleton text in ``encoding``."""
        return self.skeleton_cl100k if encoding == "cl100k_base" else self.skeleton_o200k


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
    # Hook additions a gateway check validated, carried into this re-prepare (``carry_additions_from``).
    additions: tuple[GatewayAddition, ...] = ()
    # What the release's prepare.before hooks added and deselected (checked already).
    hooked: PrepareHookChange | None = None
    # The window the view belongs to, and the handoff that opened it (services/core/windows).
    window: int = 1
    handoff: WindowHandoff | None = None

    @property
    def covered_from(self) -> int:
        """Where the history the view leaves out starts: the summary's first record, or in a window
        from 2 on the thread's first, since the handoff stands for everything the closed windows held
        (a summary of this window alone must not bring them back)."""
        return self.summary.covered_from if self.summary is not None and self.handoff is None else 0


@dataclass(frozen=True, slots=True)
class OverBudgetView:
    """What assembly gives for a view that does not fit even after the deterministic reductions: its
    history must be compacted first. The items are the kept blocks, itemized as the error reports them."""

    total: int
    input_budget: int
    items: tuple[BlockSize, ...]
    reductions: tuple[str, ...]

    @property
    def reserved_tokens(self) -> int:
        """What the prepare needs besides the view: its tool schemas."""
        return sum(int(str(item["tokens"])) for item in self.items if item["kind"] == "tool_schemas")

    def error(self) -> OverBudget:
        """The refusal, for a view that does not fit even with the history awaiting compaction dropped."""
        return OverBudget(self.total, self.input_budget, list(self.items), self.reductions)


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


@dataclass
class _Sized:
    block: DraftBlock
    content: int
    envelope: int
    masked: bool = False
    trimmed: bool = False
    deduplicated: int = 0

    @property
    def total(self) -> int:
        return self.content + self.envelope


@dataclass
class _Counts:
    deduplicated: int = 0
    trimmed: int = 0
    dropped_material: int = 0
    masked: int = 0
    summary_skeleton: int = 0
    dropped_history: int = 0
    tokens_saved: int = 0

    def report(self) -> ReductionCounts:
        return ReductionCounts(**asdict(self))


@dataclass
class _Fit:
    kept: list[_Sized]
    dropped: list[_Sized] = field(default_factory=list)
    history_dropped: list[_Sized] = field(default_factory=list)
    reductions: list[str] = field(default_factory=list)
    counts: _Counts = field(default_factory=_Counts)
    # The reductions ran for the water level (YELLOW and above), not for the input budget.
    level_trimmed: bool = False

    @property
    def total(self) -> int:
        return sum(s.total for s in self.kept)


@dataclass(frozen=True)
class _Inputs:
    """What every fitting attempt of one prepare shares."""

    ordered: list[DraftBlock]
    counter: TokenCounter | None
    summary: SummaryView | None
    own_thread: str
    room: int
    chunk: int
    # Previews name the tool that reads them back (``PrepareRequest.context_tools``).
    context_tools: bool = False
    # The view tokens that keep the context GREEN: optional material goes and older outputs are masked
    # to get under it (its water level), never the newest group, the summary or any history.
    green_room: int | None = None


def assemble_context(
    snapshot: ThreadSnapshot,
    request: PrepareRequest,
    budget: BudgetSpec,
    counter: TokenCounter | None,
    *,
    compaction_wait_ms: int = 0,
    allow_drop_history: bool = False,
    window_policy: WindowPolicy | None = None,
) -> PreparedContext | OverBudgetView:
    """The prepared context, or ``OverBudgetView`` when history must be compacted first; ``counter`` is
    ``None`` when the profile asks for the bytes/4 estimate. ``ContextBudgetExceeded`` when required
    content at its smallest does not fit: no compaction can help.

    ``window_policy``: report the context's water level and forecast
    (``PreparedContext.window_report``), and at YELLOW or above trim low-value optional material back
    toward the yellow line.

    ``allow_drop_history``: instead of answering ``OverBudgetView``, drop the oldest history (never a
    required block, never the newest complete tool group) until the context fits; each dropped
    block is listed in ``omitted``. For use once waiting for a compaction has run out.
    """
    return assemble_view(
        snapshot,
        request,
        budget,
        counter,
        compaction_wait_ms=compaction_wait_ms,
        allow_drop_history=allow_drop_history,
        window_policy=window_policy,
    ).context


@dataclass(frozen=True)
class Assembly:
    """What assembly gave, and the view's blocks it was chosen from (the next assembly's ``previous``)."""

    context: PreparedContext | OverBudgetView
    blocks: BlockSet


def assemble_view(
    snapshot: ThreadSnapshot,
    request: PrepareRequest,
    budget: BudgetSpec,
    counter: TokenCounter | None,
    *,
    compaction_wait_ms: int = 0,
    allow_drop_history: bool = False,
    window_policy: WindowPolicy | None = None,
    previous: Assembly | None = None,
) -> Assembly:
    """``assemble_context``, with the blocks it built; ``previous``: an earlier assembly of this
    thread's view, whose blocks are extended rather than built again when the view only grew since
    (``build_view_blocks``) and whose wire blocks are taken where they are equal to the new ones
    (``_emit``). The context is the same with or without it."""
    blocks, ordered = _candidates(snapshot, request, counter, previous.blocks if previous else None)
    if snapshot.hooked is not None:
        ordered = snapshot.hooked.apply(ordered)
    # Action tools only for an action; reading what the view left out helps a completion check too.
    tools: tuple[ToolSchema, ...] = request.tools if request.purpose is Purpose.ACTION else ()
    if request.context_tools and request.purpose is not Purpose.COMPACTION:
        tools = with_context_tools(tools)
        ordered.insert(_after_instructions(ordered), _context_tools_note())
    schema_tokens = _tool_tokens(tools, counter)
    room = budget.input_budget - schema_tokens - REPLY_PRIMING
    inputs = _Inputs(
        ordered,
        counter,
        snapshot.summary,
        snapshot.own_thread,
        room,
        max(1, budget.input_budget // _MASK_CHUNK_DIVISOR),
        request.context_tools,
        _green_view_room(budget.input_budget, window_policy, schema_tokens),
    )

    fit = _fit(inputs, frozenset())
    if fit.total > inputs.room:
        # Only a context that does not fit needs to know whether one could: most prepares fit at once.
        smallest = _smallest(inputs)
        minimum = sum(s.total for s in smallest) + schema_tokens + REPLY_PRIMING
        if minimum > budget.input_budget:
            err = ContextBudgetExceeded(minimum, budget.input_budget, _items(smallest, schema_tokens))
            err.details["reason"] = (
                "required content at its smallest (summary as its skeleton, the newest tool group cut to "
                f"{_MIN_OUTPUT_TOKENS} tokens per output) does not fit"
            )
            raise err
    while allow_drop_history and fit.total > inputs.room:
        dropped = frozenset(s.block.block_id for s in fit.history_dropped)
        more = _history_to_drop(fit, fit.total - inputs.room)
        if not more:
            fit = _fit(inputs, dropped, note=False)  # even the note does not fit
            break
        fit = _fit(inputs, dropped | more)
    total = fit.total + schema_tokens + REPLY_PRIMING
    if total > budget.input_budget:
        over = OverBudgetView(
            total, budget.input_budget, tuple(_items(fit.kept, schema_tokens)), tuple(fit.reductions)
        )
        return Assembly(over, blocks)

    earlier = previous.context.blocks if previous and isinstance(previous.context, PreparedContext) else ()
    out_blocks, messages = _emit(fit.kept, {b.block_id: b for b in earlier})
    used = _usage(fit.kept, schema_tokens)
    estimated, calibration = _calibrate(
        used.total, snapshot, request, fit.kept, counter.name if counter else "o200k_base", budget
    )
    omitted = [_omitted(s, "optional material dropped: over the input budget") for s in fit.dropped]
    omitted += [
        _omitted(
            s,
            "history awaiting compaction: dropped to fit because no compaction landed in time "
            f"({s.block.reason})",
        )
        for s in fit.history_dropped
    ]
    omitted += [_omitted(_size(b, counter), b.reason) for b in blocks.held]
    omitted.sort(key=lambda o: (_first_seq(o.block_id), o.block_id))
    summary = snapshot.summary
    bundle = ContextBundle(
        messages=tuple(messages),
        tools=tuple(tools),
        blocks=tuple(out_blocks),
        error_call_ids=frozenset(c for s in fit.kept for c in s.block.error_calls),
    )
    body = provider_request(request.format, bundle)
    prepared = PreparedContext(
        prepared_id=_prepared_id(snapshot, request, budget, drop_history=bool(fit.history_dropped)),
        session_id=snapshot.session_id,
        run_id=snapshot.run_id,
        instance_id=snapshot.instance_id,
        purpose=request.purpose,
        assembly_revision=ASSEMBLY_REVISION,
        source_watermark=SourceWatermark(
            thread_seq=snapshot.last_seq,
            head_revision=snapshot.revision,
            last_event_key=snapshot.last_event_key,
        ),
        messages=tuple(messages),
        tools=tuple(ChatTool(function=t) for t in tools),
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
            counting_method=_counting_method(counter, budget),
            estimated=counter is None or budget.learns_from_usage,
            estimated_input=estimated,
            calibration=calibration,
            calibration_factor=budget.calibration_factor,
            calibration_reports=budget.calibration_reports,
            reductions=fit.counts.report(),
        ),
        view_revision=snapshot.view_revision,
        summary=(
            SummaryRef(
                summary_id=summary.summary_id,
                view_revision=summary.view_revision,
                covered_from=summary.covered_from,
                covered_to=summary.covered_to,
                sources=summary.sources,
                hooks=summary.hooks,
            )
            if summary
            else None
        ),
        reductions=tuple(fit.reductions),
        compaction_wait_ms=compaction_wait_ms,
        policy=snapshot.policy,
        format=request.format,
        request=body,
        window=snapshot.window,
        handoff_id=snapshot.handoff.handoff_id if snapshot.handoff else None,
        window_report=(
            window_report(
                used.total,
                budget.input_budget,
                window_policy,
                step_growths(
                    snapshot.records,
                    own_thread=snapshot.own_thread,
                    encoding=counter.name if counter else "o200k_base",
                    last=window_policy.forecast.recent_steps,
                ),
                request.forecast,
                trimmed=fit.level_trimmed,
            )
            if window_policy is not None
            else None
        ),
        protected_block_manifest=build_manifest(request.format, out_blocks, messages, bundle.error_call_ids),
    )
    return Assembly(prepared, blocks)


def _after_task(ordered: Sequence[DraftBlock], run_task: int | None) -> int:
    """Where a window's handoff goes: after instructions and the run's task, before history."""
    at = _after_instructions(ordered)
    for i, b in enumerate(ordered):
        if b.kind is BlockKind.TASK and b.records and b.records[0].seq == run_task:
            at = i + 1
    return at


def _green_view_room(input_budget: int, window_policy: WindowPolicy | None, schema_tokens: int) -> int | None:
    """The view tokens that keep the context GREEN, when its level trims it.

    Only a ``rollover`` window trims at YELLOW: it ends at the red line, so what it leaves out early
    is room the next steps get. A ``summary`` window is compacted from ``context_ratio`` on instead,
    and trimming it earlier would only churn its prompt-cache prefix.
    """
    if window_policy is None:
        return None
    match window_policy.strategy:
        case WindowStrategy.ROLLOVER:
            return green_room(input_budget, window_policy) - schema_tokens
        case WindowStrategy.SUMMARY:
            return None
        case _:
            assert_never(window_policy.strategy)


def candidate_blocks(
    snapshot: ThreadSnapshot, request: PrepareRequest, counter: TokenCounter | None
) -> list[DraftBlock]:
    """The blocks a context of ``request`` is chosen from, in order, before any fitting (what a
    prepare.before hook sees)."""
    return _candidates(snapshot, request, counter, None)[1]


def _candidates(
    snapshot: ThreadSnapshot, request: PrepareRequest, counter: TokenCounter | None, previous: BlockSet | None
) -> tuple[BlockSet, list[DraftBlock]]:
    records = snapshot.records
    if request.context_tools:
        records = [_naming_read_tool(r, counter) for r in records]
    blocks = build_view_blocks(
        records,
        snapshot.covered_to,
        covered_from=snapshot.covered_from,
        own_thread=snapshot.own_thread,
        previous=previous,
    )
    ordered = _thread_blocks(snapshot, blocks)
    ordered.extend(_evidence_block(e, i) for i, e in enumerate(snapshot.evidence))
    ordered.extend(_addition_block(a, i) for i, a in enumerate(snapshot.additions))
    state_block = _state_block(snapshot, request.tools)
    if state_block is not None:
        ordered.append(state_block)
    return blocks, _for_purpose(ordered, request.purpose)


def shown_blocks(snapshot: ThreadSnapshot, blocks: BlockSet) -> list[DraftBlock]:
    """The blocks a context of the view shows with nothing left out, in context order: its ledger's
    and its summary, the window's handoff and the state facts (all of them, as a request whose tools
    declare no reads is shown). What the compaction measure counts; what a request brings beside
    them (evidence, hook material, carried additions) is that request's, not the thread's."""
    state_block = _state_block(snapshot, ())
    return [*_thread_blocks(snapshot, blocks), *([state_block] if state_block is not None else [])]


def _thread_blocks(snapshot: ThreadSnapshot, blocks: BlockSet) -> list[DraftBlock]:
    """The view's blocks and its summary in context order, the window's handoff after the run's task."""
    ordered = _ordered(blocks.ready, snapshot.summary, blocks.run_task)
    if snapshot.handoff is not None:
        ordered.insert(_after_task(ordered, blocks.run_task), handoff_block(snapshot.handoff))
    return ordered


# The blocks a request brings beside its thread's view: this prepare's, not the thread's history.
_REQUEST_BLOCKS = ("evidence:", "addition:", HOOK_BLOCK_PREFIX, "instruction:context_tools")


def added_tokens(prepared: PreparedContext) -> int:
    """Tokens ``prepared`` shows beside its thread's history: what its request and hooks brought
    (evidence, hook material, additions carried from a gateway check, the context-tools note). A
    context that left nothing out uses the thread's measure (``view_sizes``) plus these."""
    return sum(b.tokens for b in prepared.blocks if b.block_id.startswith(_REQUEST_BLOCKS))


def block_size(block: DraftBlock, counter: TokenCounter | None) -> int:
    """What ``block`` costs whole, as every context counts it (text, role framing, ids), every tool
    output in full: what a summarizer reads of it."""
    return _size(block, counter).total


def view_sizes(
    blocks: Sequence[DraftBlock], counter: TokenCounter | None, summary: SummaryView | None = None
) -> dict[str, int]:
    """Each of ``blocks`` (in context order) as a context counts it whole, by block id: text, role
    framing and ids, and a tool output byte-identical to an earlier one already the one-line
    reference every context shows in its place.

    The one count of a view with nothing left out: the compaction measure is made of it, so what
    ``ctxfleet compact`` reports, what ``ctxfleet context`` and the console call the whole history
    and what a context that fits uses are the same number. Deduplicated, because no context ever
    sends the second copy: the reference is not a reduction under pressure but how a view is shown.
    """
    fit = _Fit(kept=[_size(b, counter, summary) for b in blocks])
    _dedup(fit, counter)
    return {s.block.block_id: s.total for s in fit.kept}


def _after_instructions(ordered: Sequence[DraftBlock]) -> int:
    """Where the context-tools note goes: right after the leading instructions (stable prefix)."""
    n = 0
    while n < len(ordered) and ordered[n].kind is BlockKind.INSTRUCTION:
        n += 1
    return n


def _context_tools_note() -> DraftBlock:
    reason = "how to read back content this context shows only in part (context_tools)"
    note = ChatMessage(role="system", content=CONTEXT_TOOLS_NOTE)
    return DraftBlock(
        "instruction:context_tools", BlockKind.INSTRUCTION, Retention.REQUIRED, 0, reason, [], [note]
    )


def _ordered(
    ready: Sequence[DraftBlock], summary: SummaryView | None, run_task: int | None
) -> list[DraftBlock]:
    """Instructions, the run's task, the summary, then everything else in ledger order."""
    pinned: list[DraftBlock] = []
    task: list[DraftBlock] = []
    # What an earlier run of the session left in view is older than this run's task: it stays before
    # it, so a new question follows the history it asks about (and that inherited prefix is stable).
    older: list[DraftBlock] = []
    rest: list[DraftBlock] = []
    for b in ready:  # one pass: a view's blocks are many
        if b.kind is BlockKind.INSTRUCTION:
            pinned.append(b)
        elif b.kind is BlockKind.TASK and b.records[0].seq == run_task:
            task.append(b)
        elif run_task is not None and b.records and b.records[0].seq < run_task:
            older.append(b)
        else:
            rest.append(b)
    if summary is None:
        return [*pinned, *older, *task, *rest]
    block = DraftBlock(
        block_id=f"summary:{summary.covered_from}",
        kind=BlockKind.SUMMARY,
        retention=Retention.REQUIRED,
        priority=1,
        reason=(
            f"committed summary r{summary.view_revision} of records "
            f"{summary.covered_from}–{summary.covered_to}"
        ),
        records=[],
        # One message per part of the region: the parts earlier contexts showed stay the same messages,
        # which a provider's prompt cache matches whole.
        messages=[ChatMessage(role="user", content=part) for part in summary_parts(summary.text)],
    )
    return [*pinned, *older, *task, block, *rest]


def _fit(inputs: _Inputs, drop_history: frozenset[str], *, note: bool = True) -> _Fit:
    """One deterministic pass of the reduction order over the view minus ``drop_history``.

    Re-run from scratch after each drop, so that a reference never points at a dropped output.
    Dropped history leaves a note in its place (``note``) with the failures only it still showed.
    """
    fit = _Fit(kept=[])
    gap_at: int | None = None
    for b in inputs.ordered:
        sized = _size(b, inputs.counter, inputs.summary)
        if b.block_id in drop_history:
            gap_at = len(fit.kept) if gap_at is None else gap_at
            fit.history_dropped.append(sized)
            fit.reductions.append(f"dropped_history:{b.block_id}")
            fit.counts.dropped_history += 1
            fit.counts.tokens_saved += sized.total
        else:
            fit.kept.append(sized)
    gap = _gap_note(fit.history_dropped, fit.kept) if gap_at is not None and note else None
    if gap is not None and gap_at is not None:
        fit.kept.insert(gap_at, _size(gap, inputs.counter))
    sources = _dedup(fit, inputs.counter)
    newest = _newest_group(fit.kept)
    required = [s for s in fit.kept if not s.block.droppable]
    pinned = sum(s.total for s in required) + (newest.total if newest else 0)
    summary = next((s for s in fit.kept if s.block.kind is BlockKind.SUMMARY), None)
    if summary is not None and pinned > inputs.room and _to_skeleton(summary, inputs):
        fit.reductions.append(f"summary_skeleton:{summary.block.block_id}")
        fit.counts.summary_skeleton = 1
        fit.counts.tokens_saved += _size(summary.block, inputs.counter, inputs.summary).total - summary.total
    if newest is not None:
        room = inputs.room - sum(s.total for s in required)
        before = newest.total
        # What came after the newest group (the model's reply to it, a user's supplement) is newer
        # still: cut the group further to keep it, as long as the group can get that small.
        # Found by identity: ``index`` compares sized blocks field by field, records and all.
        at = next(n for n, s in enumerate(fit.kept) if s is newest)
        newer = sum(s.total for s in fit.kept[at + 1 :] if s.block.droppable)
        untrimmed = (newest.block, newest.content, newest.trimmed)
        trimmed = _trim_group(newest, room - newer, inputs) if newer else 0
        if not newer or newest.total > room - newer:
            newest.block, newest.content, newest.trimmed = untrimmed
            trimmed = _trim_group(newest, room, inputs)
        if trimmed:
            fit.reductions.append(f"trimmed:{newest.block.block_id}")
            fit.counts.trimmed += trimmed
            fit.counts.tokens_saved += before - newest.total
    _reduce(fit, inputs, newest, sources)
    return fit


def _size(block: DraftBlock, counter: TokenCounter | None, summary: SummaryView | None = None) -> _Sized:
    envelope = MESSAGE_OVERHEAD * len(block.messages) + id_tokens(block, counter)
    # Blocks the assembler writes itself (state, evidence, the context-tools note) are counted here.
    if block.kind in (BlockKind.STATE, BlockKind.MATERIAL, BlockKind.INSTRUCTION) and not block.records:
        return _Sized(block, _count_text(counter, block.messages[0].content or ""), envelope)
    if block.kind is BlockKind.SUMMARY and summary is not None:
        # Counted once when the summary was committed, like every record.
        content = summary.tokens(counter.name) if counter else estimate_tokens(summary.text)
    elif counter is not None:
        content = block.record_tokens.get(counter.name)
    else:
        content = _content_tokens(block, block.records, counter)
    return _Sized(block, content, envelope)


def _content_tokens(block: DraftBlock, records: Sequence[LedgerRecord], counter: TokenCounter | None) -> int:
    if counter is None:
        return sum(estimate_tokens(m.model_dump_json(exclude_none=True)) for m in block.messages)
    enc: EncodingName = counter.name
    return sum(r.tokens.get(enc) for r in records)


def _raw_id(view_id: str, recorded: Mapping[str, object]) -> str:
    # An inherited call is shown as ``call_id@tag``; the tag never contains "@".
    return view_id if view_id in recorded else view_id.rsplit("@", 1)[0]


def _counts_as(counter: TokenCounter | None, content: str) -> TokenCounts:
    # Only the counter's own encoding is ever read back within one assembly.
    n = _count_text(counter, content)
    return TokenCounts(o200k_base=n, cl100k_base=n)


def _with_records(s: _Sized, records: list[LedgerRecord], counter: TokenCounter | None) -> int:
    """Replace a block's records (and its tool messages' content); returns the tokens saved."""
    before = s.content
    s.block = replace(s.block, records=records, messages=_remessage(s.block, records))
    s.content = _content_tokens(s.block, records, counter)
    return before - s.content


def _dedup(fit: _Fit, counter: TokenCounter | None) -> frozenset[int]:
    """Later byte-identical tool outputs (same tool, status and text) as references;
    returns the sources' seqs.

    Only tool outputs: a user's repeated constraint is never deduplicated. A short output (an empty
    ``<returncode>0</returncode>``) stays as it is: a pointer would save nothing and tell less.
    """
    first: dict[tuple[str, str, str], int] = {}
    sources: set[int] = set()
    for s in fit.kept:
        if not s.block.block_id.startswith("group:"):
            continue
        repeats: dict[int, int] = {}
        for key, seq in s.block.outcomes:
            if first.setdefault(key, seq) != seq:
                repeats[seq] = first[key]
        if not repeats:
            continue
        records: list[LedgerRecord] = []
        seqs: list[int] = []
        for r in s.block.records:
            source = repeats.get(r.seq)
            if source is not None and isinstance(r.body, ToolOutcomePayload):
                text = f"[identical to the output at seq {source}]"
                tokens = _counts_as(counter, record_content(r.body, text))
                shown = _record_tokens(r, counter)
                if shown >= _MIN_DEDUP_TOKENS and tokens.o200k_base < shown:
                    r = replace(r, text=text, tokens=tokens, mask_text=None, mask_tokens=None)
                    seqs.append(r.seq)
            records.append(r)
        if not seqs:
            continue
        fit.counts.tokens_saved += _with_records(s, records, counter)
        s.deduplicated = len(seqs)
        sources.update(repeats[seq] for seq in seqs)
        fit.reductions.extend(f"deduplicated:{s.block.block_id}@{seq}" for seq in seqs)
        fit.counts.deduplicated += len(seqs)
    return frozenset(sources)


def _newest_group(kept: Sequence[_Sized]) -> _Sized | None:
    return next((s for s in reversed(kept) if s.block.block_id.startswith("group:")), None)


def _to_skeleton(s: _Sized, inputs: _Inputs) -> bool:
    summary = inputs.summary
    if summary is None or summary.skeleton_text is None:
        return False
    counter = inputs.counter
    s.block = replace(
        s.block,
        messages=[ChatMessage(role="user", content=summary.skeleton_text)],
        reason=s.block.reason
        + (
            "; shown as its skeleton: the full summary did not fit next to the required blocks and the "
            "newest tool group"
        ),
    )
    if counter is None:
        s.content = estimate_tokens(summary.skeleton_text)
    else:
        # Counted when the summary was committed; a view that did not fill the counts is counted here.
        s.content = summary.skeleton_tokens(counter.name) or counter.count(summary.skeleton_text)
    return True


def _smallest(inputs: _Inputs) -> list[_Sized]:
    """What must be sent, at its smallest: required blocks, the summary skeleton,
    the newest group cut to the minimum."""
    sized = [_size(b, inputs.counter, inputs.summary) for b in inputs.ordered]
    out: list[_Sized] = []
    for s in sized:
        if s.block.droppable:
            continue
        if s.block.kind is BlockKind.SUMMARY:
            _to_skeleton(s, inputs)
        out.append(s)
    newest = _newest_group(sized)
    if newest is not None:
        outputs = [r for r in newest.block.records if r.kind is EventKind.TOOL_OUTCOME]
        floor = sum(min(_record_tokens(r, inputs.counter), _MIN_OUTPUT_TOKENS) for r in outputs)
        smallest = replace(newest)
        _cut_calls(smallest, 0, inputs)  # every long argument at its shortest
        out.append(replace(smallest, content=_calls_tokens(smallest.block, inputs.counter) + floor))
    return out


def _calls_tokens(block: DraftBlock, counter: TokenCounter | None) -> int:
    """Tokens of a group's assistant message (its text and calls), without the outputs."""
    if counter is None:
        return estimate_tokens(block.messages[0].model_dump_json(exclude_none=True))
    return sum(r.tokens.get(counter.name) for r in block.records if r.kind is not EventKind.TOOL_OUTCOME)


def _record_tokens(r: LedgerRecord, counter: TokenCounter | None) -> int:
    if counter is not None:
        return r.tokens.get(counter.name)
    return _output_tokens(r, r.text, None)


def _output_tokens(r: LedgerRecord, text: str, counter: TokenCounter | None) -> int:
    """What an outcome costs shown with ``text``: its content,
    or for the estimate its whole dumped message."""
    body = _outcome(r)
    content = record_content(body, text)
    if counter is not None:
        return counter.count(content)
    message = ChatMessage(role="tool", content=content, tool_call_id=body.call_id)
    return estimate_tokens(message.model_dump_json(exclude_none=True))


def _trim_group(s: _Sized, room: int, inputs: _Inputs) -> int:
    """Cut the newest group's outputs to head + tail so that the group fits ``room``;
    returns how many were cut.

    Room is shared evenly, an output smaller than its share keeps all of it and leaves the rest
    to the others; no output is cut below ``_MIN_OUTPUT_TOKENS``. The block is measured again
    after cutting (the estimate profile counts whole dumped messages) and cut tighter if needed.
    """
    if s.total <= room:
        return 0
    block, content, target, cut = s.block, s.content, room, 0
    for _ in range(4):
        s.block, s.content = block, content
        cut = _cut_outputs(s, target, inputs)
        if s.total <= room:
            break
        target -= s.total - room
    s.trimmed = cut > 0
    return cut


def _cut_outputs(s: _Sized, room: int, inputs: _Inputs) -> int:
    counter = inputs.counter
    outputs = sorted(
        (r for r in s.block.records if r.kind is EventKind.TOOL_OUTCOME),
        key=lambda r: (_record_tokens(r, counter), r.seq),
    )
    floor = sum(min(_record_tokens(r, counter), _MIN_OUTPUT_TOKENS) for r in outputs)
    calls_cut = int(_cut_calls(s, room - s.envelope - floor, inputs))
    left = room - s.envelope - _calls_tokens(s.block, counter)
    allowed: dict[int, int] = {}
    for i, r in enumerate(outputs):
        share = max(_MIN_OUTPUT_TOKENS, left // (len(outputs) - i))
        allowed[r.seq] = min(_record_tokens(r, counter), share)
        left -= allowed[r.seq]
    records: list[LedgerRecord] = []
    cut = 0
    for r in s.block.records:
        if r.kind is not EventKind.TOOL_OUTCOME or allowed[r.seq] >= _record_tokens(r, counter):
            records.append(r)
            continue
        frame = _output_tokens(r, "", counter)
        body = allowed[r.seq] - frame
        if counter is None:
            # The estimate counts the dumped message: escapes make it cost more than the raw text.
            body = body * estimate_tokens(r.text) // max(1, _record_tokens(r, None) - frame)
        text = _trim_output(r, s.block.records, counter, max(0, body), _read_back(r, inputs))
        tokens = _counts_as(counter, record_content(r.body, text))
        if _output_tokens(r, text, counter) >= _record_tokens(r, counter):
            records.append(r)
            continue
        records.append(replace(r, text=text, tokens=tokens, mask_text=None, mask_tokens=None))
        cut += 1
    if cut:
        _with_records(s, records, counter)
    return cut + calls_cut


def _cut_calls(s: _Sized, room: int, inputs: _Inputs) -> bool:
    """Cut the long string arguments of a group's calls (a heredoc, a file's new content), then the
    message's own text, to head + tail, so that its assistant message takes at most ``room`` (never
    below ``_MIN_ARG_TOKENS`` each); returns whether anything was cut.

    The arguments stay valid JSON with their keys; each cut value says where the whole call can be
    read again. Only what the model needs to recognise its own last action is kept.
    """
    counter = inputs.counter
    head = s.block.records[0]
    body = head.body
    over = _calls_tokens(s.block, counter) - room
    if over <= 0 or not isinstance(body, AssistantMessagePayload):
        return False
    read_back = _read_back(head, inputs)
    calls = list(body.tool_calls)
    longs = sorted(
        (
            (_count_text(counter, v), i, k)
            for i, c in enumerate(calls)
            for k, v in c.args.items()
            if isinstance(v, str) and _count_text(counter, v) > _MIN_ARG_TOKENS
        ),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    text_tokens = _count_text(counter, head.text)
    if not longs and text_tokens <= _MIN_ARG_TOKENS:
        return False
    for tokens, i, key in longs:
        if over <= 0:
            break
        cut = trim_to_fit(
            str(calls[i].args[key]),
            counter,
            max_tokens=max(_MIN_ARG_TOKENS, tokens - over),
            read_back=read_back,
        )
        over -= tokens - _count_text(counter, cut)
        calls[i] = calls[i].model_copy(update={"args": {**calls[i].args, key: cut}})
    text = head.text
    if over > 0 and text_tokens > _MIN_ARG_TOKENS:
        # Then the model's own words before the calls: its reasoning, head and tail.
        text = trim_to_fit(
            text, counter, max_tokens=max(_MIN_ARG_TOKENS, text_tokens - over), read_back=read_back
        )
    message = s.block.messages[0]
    shown = [
        c.model_copy(
            update={"function": c.function.model_copy(update={"arguments": arguments_json(calls[n].args)})}
        )
        for n, c in enumerate(message.tool_calls or ())
    ]
    n = count_rendered(
        counter, text, [RenderedCall(c.call_id, c.name, arguments_json(c.args)) for c in calls]
    )
    # The payload is what the body is read from: the cut calls go there.
    stored: list[JsonValue] = [c.model_dump(mode="json") for c in calls]
    payload: dict[str, JsonValue] = {**head.payload, "tool_calls": stored}
    record = replace(head, text=text, payload=payload, tokens=TokenCounts(o200k_base=n, cl100k_base=n))
    records = [record, *s.block.records[1:]]
    update: dict[str, object] = {
        "tool_calls": tuple(shown),
        "content": (text or None) if message.content is not None else None,
    }
    s.block = replace(
        s.block, records=records, messages=[message.model_copy(update=update), *s.block.messages[1:]]
    )
    s.content = _content_tokens(s.block, records, counter)
    s.trimmed = True
    return True


def _count_text(counter: TokenCounter | None, text: str) -> int:
    return counter.count(text) if counter else estimate_tokens(text)


def _trim_output(
    r: LedgerRecord,
    records: Sequence[LedgerRecord],
    counter: TokenCounter | None,
    max_tokens: int,
    read_back: str,
) -> str:
    """Head + tail of an output; a failed one keeps its telling line even when it sits in the middle."""
    text = trim_to_fit(r.text, counter, max_tokens=max_tokens, read_back=read_back)
    failure = _failure(r, records)
    line = failure.line if failure is not None and failure.line else None
    if line is None or line in text:
        return text
    suffix = f"\n[telling line: {line}]"
    cut = trim_to_fit(
        r.text, counter, max_tokens=max(0, max_tokens - _count_text(counter, suffix)), read_back=read_back
    )
    return cut + suffix


def _outcome(r: LedgerRecord) -> ToolOutcomePayload:
    # Only tool outcomes are ever cut, masked or deduplicated.
    assert isinstance(r.body, ToolOutcomePayload), f"record {r.seq} is a {r.kind}, not a tool outcome"
    return r.body


def _failure(r: LedgerRecord, records: Sequence[LedgerRecord]) -> Failure | None:
    """How the outcome ``r`` failed, its call looked up among ``records`` (its group's or the view's)."""
    if not isinstance(r.body, ToolOutcomePayload):
        return None
    call_id = r.body.call_id
    call = next(
        (
            c
            for a in records
            if isinstance(a.body, AssistantMessagePayload) and a.thread_id == r.thread_id
            for c in a.body.tool_calls
            if c.call_id == call_id
        ),
        None,
    )
    return failure_of(call, r.body.status, r.text)


def _naming_read_tool(r: LedgerRecord, counter: TokenCounter | None) -> LedgerRecord:
    """``r`` with its stored previews (head + tail, mask) naming the tool that reads the rest, recounted.

    Only the recorder's previews of tool outputs and of long user inputs name a blob this way."""
    if r.kind not in (EventKind.TOOL_OUTCOME, EventKind.USER_INPUT):
        return r
    text = name_read_tool(r.text)
    mask_text = None if r.mask_text is None else name_read_tool(r.mask_text)
    if text == r.text and mask_text == r.mask_text:
        return r
    tokens = r.tokens if text == r.text else _counts_as(counter, record_content(r.body, text))
    mask_tokens = r.mask_tokens
    if mask_text is not None and mask_text != r.mask_text:
        mask_tokens = _counts_as(counter, record_content(r.body, mask_text))
    return replace(r, text=text, tokens=tokens, mask_text=mask_text, mask_tokens=mask_tokens)


def _read_back(r: LedgerRecord, inputs: _Inputs) -> str:
    ref = read_back_ref(r.text) or read_back_ref(r.mask_text or "")
    thread = r.thread_id or inputs.own_thread
    if inputs.context_tools and (ref is not None or thread):
        return read_back_with_tool(ref or record_ref(thread, r.thread_seq or r.seq))
    if ref is not None:
        return f"read it back from {ref}"
    where = f"thread {thread}, seq {r.thread_seq or r.seq}" if thread else f"seq {r.seq}"
    return f"re-read it as evidence: {where}"


def _reduce(fit: _Fit, inputs: _Inputs, newest: _Sized | None, sources: frozenset[int]) -> None:
    """Reduce to the room, or to the green line when the window policy gives one (YELLOW trimming)."""
    target = inputs.room if inputs.green_room is None else min(inputs.room, inputs.green_room)
    # Only what fits the budget anyway and still went is the level's doing.
    for_level = fit.total <= inputs.room
    saved = fit.counts.tokens_saved
    _reduce_to(fit, inputs, newest, sources, target)
    fit.level_trimmed = for_level and fit.counts.tokens_saved > saved


def _reduce_to(
    fit: _Fit, inputs: _Inputs, newest: _Sized | None, sources: frozenset[int], target: int
) -> None:
    """Drop optional material (oldest first), then mask outputs oldest first in chunks,
    until the blocks fit ``target``."""

    # Kept up to date below rather than summed again after every step (a view holds hundreds of groups).
    total = fit.total
    if total <= target:
        return
    for s in sorted(
        (s for s in fit.kept if s.block.kind is BlockKind.MATERIAL),
        key=lambda s: _first_seq(s.block.block_id),
    ):
        if total <= target:
            return
        # By identity: ``list.remove`` compares sized blocks field by field, records and all.
        del fit.kept[next(n for n, k in enumerate(fit.kept) if k is s)]
        total -= s.total
        fit.dropped.append(s)
        fit.reductions.append(f"dropped:{s.block.block_id}")
        fit.counts.dropped_material += 1
        fit.counts.tokens_saved += s.total
    groups = [s for s in fit.kept if s.block.block_id.startswith("group:")]
    for boundary in _mask_boundaries(groups, inputs.chunk, inputs.counter):
        if total <= target:
            return
        for s in groups[:boundary]:
            if s.masked or s is newest:
                continue
            saved = _mask(s, inputs.counter, sources)
            if saved > 0:
                total -= saved
                fit.reductions.append(f"masked:{s.block.block_id}")
                fit.counts.masked += 1
                fit.counts.tokens_saved += saved


def _mask_boundaries(groups: Sequence[_Sized], chunk: int, counter: TokenCounter | None) -> list[int]:
    """How many of the oldest groups to mask, least first: chunk edges, then all but the newest two."""
    last = len(groups) - _KEEP_UNMASKED_GROUPS
    edges: list[int] = []
    saved = 0
    for k, s in enumerate(groups[: max(0, last)], start=1):
        saved += _mask_saving(s.block, counter)
        if saved >= chunk * (len(edges) + 1):
            edges.append(k)
    return [*edges, last] if last > 0 else []


def _mask_saving(block: DraftBlock, counter: TokenCounter | None) -> int:
    """What showing ``block``'s long outputs as previews would save."""
    return sum(
        _record_tokens(r, counter)
        - (r.mask_tokens.get(counter.name) if counter else estimate_tokens(r.mask_text))
        for r in block.records
        if r.kind is EventKind.TOOL_OUTCOME and r.mask_text is not None and r.mask_tokens is not None
    )


def _mask(s: _Sized, counter: TokenCounter | None, sources: frozenset[int]) -> int:
    """Show a group's long tool outputs as their previews; returns the tokens saved.

    An output another one refers to as identical is kept whole. A failed output keeps its telling
    line (error class and message, failing test, exit status): the last error stays visible.
    """
    records = []
    for record in s.block.records:
        if (
            record.kind is EventKind.TOOL_OUTCOME
            and record.mask_text is not None
            and record.mask_tokens is not None
            and record.seq not in sources
        ):
            text, tokens = record.mask_text, record.mask_tokens
            failure = _failure(record, s.block.records)
            line = failure.line if failure is not None else None
            if line and line not in text:
                text = f"{text}\n[telling line: {line}]"
                tokens = _counts_as(counter, record_content(record.body, text))
            record = replace(record, text=text, tokens=tokens)
        records.append(record)
    block = replace(s.block, records=records, messages=_remessage(s.block, records))
    content = _content_tokens(block, records, counter)
    if content >= s.content:
        return 0
    saved = s.content - content
    s.block, s.content, s.masked = block, content, True
    return saved


def _remessage(block: DraftBlock, records: list[LedgerRecord]) -> list[ChatMessage]:
    # Tool messages carry the view id (tagged when inherited); outcome records the raw call id.
    texts = {
        r.body.call_id: record_content(r.body, r.text)
        for r in records
        if isinstance(r.body, ToolOutcomePayload)
    }
    return [
        m.model_copy(update={"content": texts[_raw_id(m.tool_call_id or "", texts)]})
        if m.role == "tool"
        else m
        for m in block.messages
    ]


def _gap_note(dropped: Sequence[_Sized], kept: Sequence[_Sized]) -> DraftBlock | None:
    """Where history was left out, and the failures it held that no later call of the same command redid.

    The last error stays visible until a compaction folds it into the summary.
    """
    records = sorted((r for s in dropped for r in s.block.records), key=lambda r: r.seq)
    if not records:
        return None
    calls: dict[tuple[str, str], tuple[str, str]] = {}
    last: dict[tuple[str, str], LedgerRecord] = {}
    for r in sorted((r for s in [*dropped, *kept] for r in s.block.records), key=lambda r: r.seq):
        body = r.body
        if isinstance(body, AssistantMessagePayload):
            for c in body.tool_calls:
                calls[(r.thread_id, c.call_id)] = (
                    c.name,
                    json.dumps(c.args, ensure_ascii=False, separators=(",", ":")),
                )
        elif isinstance(body, ToolOutcomePayload):
            key = calls.get((r.thread_id, body.call_id))
            if key is not None:
                last[key] = r
    lost = {r.seq for r in records}
    lines = [
        f"[history awaiting compaction: {len(dropped)} block(s) of records "
        f"{records[0].seq}–{records[-1].seq} left out to fit the budget; they are still in the ledger]"
    ]
    read, modified = _files_touched([s for s in dropped if s.block.block_id.startswith("group:")])
    for how, paths in (("modified", modified), ("read", read)):
        if paths:
            more = " …" if len(paths) > _GAP_FILES else ""
            lines.append(f"- files {how} there: " + ", ".join(paths[:_GAP_FILES]) + more)
    everything = [r for s in [*dropped, *kept] for r in s.block.records]
    failed = [
        (key, r, failure)
        for key, r in last.items()
        if r.seq in lost and (failure := _failure(r, everything)) is not None
    ]
    for (name, args), r, failure in sorted(failed, key=lambda kv: kv[1].seq)[-_GAP_FAILURES:]:
        # Without an error line, the first line tells what the call was doing (as a preview would).
        line = failure.line or next(
            (x.strip()[:300] for x in r.text.splitlines() if x.strip()), "(no output)"
        )
        lines.append(f"- last {name} {args} failed (seq {r.seq}, {failure.status}): {line}")
    # Required while it stands in for history: the newest group makes room for it, and when
    # even that does not fit, the context is assembled without it (``note=False``).
    return user_block(
        f"history-gap:{records[0].seq}",
        BlockKind.STATE,
        Retention.REQUIRED,
        0,
        "history left out while compaction catches up: where, and the failures it held",
        "\n".join(lines),
    )


def _files_touched(groups: Sequence[_Sized]) -> tuple[list[str], list[str]]:
    """Files the groups' calls read and modified, first seen first, from the calls themselves."""
    read: dict[str, None] = {}
    modified: dict[str, None] = {}
    for s in groups:
        body = s.block.records[0].body
        for c in body.tool_calls if isinstance(body, AssistantMessagePayload) else ():
            access = files_of_call(c.name, c.args)
            modified.update(dict.fromkeys(access.modified))
            read.update(dict.fromkeys(p for p in access.read if p not in modified))
    return list(read), list(modified)


def _history_to_drop(fit: _Fit, over: int) -> frozenset[str]:
    """The oldest droppable history blocks whose tokens cover ``over`` (never the newest group)."""
    newest = _newest_group(fit.kept)
    chosen: list[str] = []
    for s in fit.kept:
        if over <= 0:
            break
        if not s.block.droppable or s is newest or s.block.kind is BlockKind.MATERIAL or not s.block.records:
            continue
        chosen.append(s.block.block_id)
        over -= s.total
    return frozenset(chosen)


def _for_purpose(blocks: list[DraftBlock], purpose: Purpose) -> list[DraftBlock]:
    match purpose:
        case Purpose.ACTION | Purpose.COMPACTION:
            return blocks
        case Purpose.COMPLETION:
            return _completion_blocks(blocks)
        case _:
            assert_never(purpose)


def _completion_blocks(blocks: list[DraftBlock]) -> list[DraftBlock]:
    """A completion check's context: the task and what the user asked since, the authoritative plan and
    state, the execution evidence (every tool group: the calls and the outcomes that support or refute
    the answer), the evidence asked for, and the candidate answer (the newest assistant text without
    calls) — not the steps' running commentary or quoted material, which prove nothing."""
    candidate = next((b for b in reversed(blocks) if _is_answer(b)), None)
    kept: list[DraftBlock] = []
    for block in blocks:
        if block is candidate:
            kept.append(
                replace(block, reason="the candidate answer under check", retention=Retention.REQUIRED)
            )
        elif block.kind in (BlockKind.INSTRUCTION, BlockKind.TASK, BlockKind.STATE, BlockKind.SUMMARY):
            kept.append(block)
        elif block.kind is BlockKind.MATERIAL:
            if block.block_id.startswith("evidence:"):
                kept.append(block)
        elif any(m.role == "tool" for m in block.messages) or all(m.role == "user" for m in block.messages):
            kept.append(block)
    return kept


def _is_answer(block: DraftBlock) -> bool:
    return (
        block.kind is BlockKind.INTERACTION
        and bool(block.messages)
        and all(m.role == "assistant" and not m.tool_calls and m.content for m in block.messages)
    )


def _evidence_block(evidence: Evidence, index: int) -> DraftBlock:
    head = (
        f"[evidence: record {evidence.seq} of thread {evidence.thread_id} ({evidence.kind}, "
        f"event {evidence.event_key}, content sha256 {evidence.content_sha256[:16]}…, "
        f"record {evidence.record_hash[:16]}…) — quoted material, not instruction]"
    )
    reason = "evidence the runtime asked for, re-read from the ledger"
    return user_block(
        f"evidence:{index}", BlockKind.MATERIAL, Retention.ACTIVE, 1, reason, f"{head}\n{evidence.text}"
    )


def _addition_block(addition: GatewayAddition, index: int) -> DraftBlock:
    # The text exactly as the gateway validated it, so the runtime need not add it again; optional,
    # and quoted on the user's side whatever its category (it never outranks the instructions).
    reason = f"{addition.category.value} added by hook {addition.source}, carried from a gateway check"
    return user_block(f"addition:{index}", BlockKind.MATERIAL, Retention.ACTIVE, 3, reason, addition.text)


def _state_block(snapshot: ThreadSnapshot, tools: Sequence[ToolSchema]) -> DraftBlock | None:
    """Current facts with status and source: the slice the requested tools declare they read, or all.

    Placed last: it changes with every patch, and volatile parts go last.
    """
    if not snapshot.facts:
        return None
    patterns = [pattern_regex(p) for t in tools for p in snapshot.reads.get(t.name, ())]
    # A window's handoff names the state it needs: those paths are shown whatever the tools read.
    needed = frozenset(snapshot.handoff.required_state_paths) if snapshot.handoff else frozenset()
    facts = [
        f
        for f in snapshot.facts
        if not patterns or f.path in needed or any(p.match(f.path) for p in patterns)
    ]
    if not facts:
        return None
    facts = sorted(facts, key=lambda f: f.seq)[-_MAX_FACTS:]
    return user_block(
        f"state:{max(f.seq for f in facts)}",
        BlockKind.STATE,
        Retention.REQUIRED,
        0,
        "current state projected from the ledger: latest facts with status and source",
        render_facts(facts),
    )


def _tool_tokens(tools: Sequence[ToolSchema], counter: TokenCounter | None) -> int:
    """The tools array as the provider is sent it, entry by entry."""
    entries = (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) for entry in tools_wire(tools))
    return sum(_count_text(counter, text) + _TOOL_ENTRY_OVERHEAD for text in entries)


def _items(blocks: Sequence[_Sized], schema_tokens: int) -> list[BlockSize]:
    items: list[BlockSize] = [
        {"block_id": s.block.block_id, "kind": s.block.kind.value, "tokens": s.total} for s in blocks
    ]
    items.append({"block_id": "tool_schemas", "kind": "tool_schemas", "tokens": schema_tokens})
    items.append({"block_id": "reply_priming", "kind": "envelope", "tokens": REPLY_PRIMING})
    return items


def _first_seq(block_id: str) -> int:
    """The ledger position a block's id ends with (``kind:seq``). Hook material has none: it is this
    prepare's temporary input, ordered and dropped before any material from the ledger."""
    if block_id.startswith(HOOK_BLOCK_PREFIX):
        return -1
    return int(block_id.rsplit(":", 1)[1])


def _emit(
    kept: Sequence[_Sized], earlier: Mapping[str, ContextBlock]
) -> tuple[list[ContextBlock], list[ChatMessage]]:
    """The wire blocks and messages of ``kept``; a wire block equal to one of ``earlier`` (the previous
    context's, by block id) is that one: most of a view is the same blocks at the same places."""
    blocks: list[ContextBlock] = []
    messages: list[ChatMessage] = []
    for s in kept:
        b = s.block
        reason = b.reason
        if s.deduplicated:
            reason += f"; {s.deduplicated} output(s) identical to an earlier one shown as a reference"
        if s.trimmed:
            reason += "; newest tool group: outputs cut to head + tail to fit, with where to read them back"
        if s.masked:
            reason += "; long tool outputs masked to previews (over budget)"
        known = earlier.get(b.block_id)
        if known is None or not _same_wire(known, s, reason, len(messages)):
            known = _wire(s, reason, len(messages))
        blocks.append(known)
        messages.extend(b.messages)
    return blocks, messages


def _wire(s: _Sized, reason: str, first_message: int) -> ContextBlock:
    b = s.block
    return ContextBlock(
        block_id=b.block_id,
        kind=b.kind,
        retention=b.retention,
        priority=b.priority,
        droppable=b.droppable,
        reason=reason,
        sources=b.sources,
        first_message=first_message,
        message_count=len(b.messages),
        tokens=s.total,
    )


def _same_wire(known: ContextBlock, s: _Sized, reason: str, first_message: int) -> bool:
    """Whether ``_wire(s, reason, first_message)`` would give ``known``: every field compared
    (``droppable`` follows ``retention``; the block id was the lookup's key)."""
    b = s.block
    return (
        known.first_message == first_message
        and known.tokens == s.total
        and known.message_count == len(b.messages)
        and known.kind is b.kind
        and known.retention is b.retention
        and known.priority == b.priority
        and known.reason == reason
        and known.sources == b.sources
    )


def _usage(kept: Sequence[_Sized], schema_tokens: int) -> BudgetCategory:
    # A block counts whole in its category, message framing included, so that a category is the sum
    # of the blocks a person sees in it; envelopes are what no block carries (the reply priming).
    by: dict[str, int] = {"instructions": 0, "history": 0, "materials": 0, "summaries": 0}
    for s in kept:
        by[_CATEGORY[s.block.kind]] += s.total
    total = sum(by.values()) + REPLY_PRIMING + schema_tokens
    return BudgetCategory(tool_schemas=schema_tokens, envelopes=REPLY_PRIMING, total=total, **by)


def _counting_method(counter: TokenCounter | None, budget: BudgetSpec) -> str:
    if counter is None:
        return ESTIMATE_METHOD
    # A profile without an offline tokenizer: the local count times its learned factor.
    return f"{counter.method}*calibration" if budget.learns_from_usage else counter.method


def _calibrate(
    local: int,
    snapshot: ThreadSnapshot,
    request: PrepareRequest,
    kept: Sequence[_Sized],
    encoding: EncodingName,
    budget: BudgetSpec,
) -> tuple[int, str]:
    """Provider usage of the last response plus local counts of what came after it (docs/design.md,
    "Provider usage calibrates the count"),
    the local part as the provider counts it (times the profile's calibration factor)."""
    factor = budget.calibration_factor
    usage = request.usage
    if usage is None or usage.view_revision != snapshot.view_revision:
        return scaled(local, factor), "local"
    response = next((r.seq for r in snapshot.records if r.event_key == usage.response_event_key), None)
    if response is None:
        return scaled(local, factor), "local"
    after = sum(
        sum(r.tokens.get(encoding) for r in s.block.records if r.seq > response) + MESSAGE_OVERHEAD
        for s in kept
        if any(r.seq > response for r in s.block.records)
    )
    return usage.input_tokens + usage.output_tokens + scaled(after, factor), "provider_usage+local"


def _omitted(s: _Sized, reason: str) -> OmittedBlock:
    return OmittedBlock(
        block_id=s.block.block_id,
        kind=s.block.kind,
        reason=reason,
        sources=s.block.sources,
        tokens=s.total,
    )


def _prepared_id(
    snapshot: ThreadSnapshot, request: PrepareRequest, budget: BudgetSpec, *, drop_history: bool = False
) -> str:
    # wait_ms and the watermark only decide when to answer, not what: they are not part of the id.
    # The format only changes the shape, never the context: one id whatever the provider.
    # A reply after a provider overflow differs only by its calibrated budget, which is in the id.
    # A task budget is reported after assembly and changes no context.
    excluded = {"wait_ms", "after_event_key", "after_event_hash", "format", "after_overflow", "task_budget"}
    # What a request leaves empty is left out, so ids minted before it existed (evidence, context
    # tools, forecasts, gateway checks) stay the same; so is the history-dropping fallback unless it
    # changed the reply.
    unset = {
        "evidence": not request.evidence,
        "context_tools": not request.context_tools,
        "forecast": request.forecast is None,
        "carry_additions_from": request.carry_additions_from is None,
    }
    excluded |= {name for name, empty in unset.items() if empty}
    fingerprint: dict[str, JsonValue] = {
        "request": request.model_dump(mode="json", exclude=excluded),
        "thread": f"{snapshot.run_id}.{snapshot.instance_id}",
        "revision": snapshot.revision,
        "view_revision": snapshot.view_revision,
        "budget": budget.input_budget,
        "assembly": ASSEMBLY_REVISION,
    }
    if drop_history:
        fingerprint["history_dropped"] = True
    if snapshot.handoff is not None:  # left out in window 1, so ids minted before windows stay the same
        fingerprint["handoff"] = snapshot.handoff.handoff_id
    hooked = snapshot.hooked
    if hooked is not None and (hooked.additions or hooked.deselected):
        # A hook's answer may differ between two prepares of the same state: the gateway's check finds
        # a context by its id, so what the hooks changed is part of it (left out when they changed nothing).
        added: list[JsonValue] = [
            [b.block_id, *(m.content or "" for m in b.messages)] for b in hooked.additions
        ]
        deselected: list[JsonValue] = [d for d in sorted(hooked.deselected)]
        fingerprint["hooks"] = {"added": added, "deselected": deselected}
    return str(uuid.uuid5(_PREPARED_NS, canonical_json(fingerprint).decode()))
