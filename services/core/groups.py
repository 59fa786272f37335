"""Blocks from records, with tool groups kept whole. Pure.

Invariants, one function each:

1. Instructions (``system`` records) are pinned before all history (``build_blocks``).
2. An assistant message with N tool calls forms one group with exactly its N outcomes, the
   outcomes in call order right after it (``_close_groups``).
3. A group still missing an outcome is never sent as half a group: it is held back whole and its
   calls are reported as pending (``_close_groups``).
4. An outcome never appears without its call: the recorder refuses orphans, and an outcome whose
   group is unknown here is ignored rather than sent alone (``_attach_outcome``).
5. Material (resources, child results) is quoted in a user message; it never becomes instruction.
6. The run's task (the first question of the thread's own run) and the current request are task
   blocks, required and never covered by a summary (``run_task_seq``, ``_uncovered``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import assert_never

from contracts import (
    AssistantMessagePayload,
    BlockKind,
    ChatFunction,
    ChatMessage,
    ChatToolCall,
    ChildResultPayload,
    ContextExportPayload,
    ContextResetPayload,
    EventKind,
    OperationReconcilePayload,
    PendingCall,
    PhaseChangePayload,
    RecordRef,
    ResourceActivatedPayload,
    Retention,
    RunStatusPayload,
    StatePatchPayload,
    SystemPayload,
    ToolOutcomePayload,
    ToolStatus,
    UserInputPayload,
)

from services.core.turns import counts_as_turn
from services.core.records import LedgerRecord, TokenCounts, ascending_by_seq
from services.core.render import arguments_json, record_content
from services.core.tokens import TokenCounter, counter_for

__all__ = [
    "BlockSet",
    "DraftBlock",
    "build_blocks",
    "build_view_blocks",
    "id_tokens",
    "run_task_seq",
    "user_block",
]


@dataclass(frozen=True)
class DraftBlock:
    """A block of the view: its messages and the records they came from.

    What assembly measures of a block on every prepare is derived here, once, at construction
    (``replace`` derives it again): a block kept from an earlier build brings it along.
    """

    block_id: str
    kind: BlockKind
    retention: Retention
    priority: int
    reason: str
    records: Sequence[LedgerRecord]
    messages: Sequence[ChatMessage]
    # Tool call ids (as the view names them) whose outcome was not a success: a provider that marks
    # failed results (Anthropic's ``is_error``) learns it here, not from the message text.
    error_calls: frozenset[str] = frozenset()
    # The records this block was built from, in seq order.
    sources: tuple[RecordRef, ...] = field(init=False, repr=False, compare=False)
    # What a record's count (fixed at recording) misses of the ids sent with the block's messages.
    id_counts: TokenCounts = field(init=False, repr=False, compare=False)
    # The tokens its records were counted at when recorded, summed.
    record_tokens: TokenCounts = field(init=False, repr=False, compare=False)
    # What makes each tool output of the block identical to another (tool, status, text), with its seq.
    outcomes: tuple[tuple[tuple[str, str, str], int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A frozen dataclass sets what it derives through object.__setattr__ (the dataclasses docs' way).
        records, messages = tuple(self.records), tuple(self.messages)
        object.__setattr__(self, "records", records)
        object.__setattr__(self, "messages", messages)
        object.__setattr__(
            self,
            "sources",
            tuple(
                RecordRef(seq=r.seq, event_key=r.event_key, kind=r.kind) for r in sorted(records, key=_seq)
            ),
        )
        object.__setattr__(
            self,
            "id_counts",
            TokenCounts(
                _count_ids(records, messages, counter_for("o200k_base")),
                lambda: _count_ids(records, messages, counter_for("cl100k_base")),
            ),
        )
        object.__setattr__(
            self,
            "record_tokens",
            TokenCounts(
                sum(r.tokens.o200k_base for r in records), lambda: sum(r.tokens.cl100k_base for r in records)
            ),
        )
        object.__setattr__(self, "outcomes", _outcome_keys(records))

    @property
    def droppable(self) -> bool:
        """Whether the assembler may leave this block out to fit the budget."""
        return self.retention is not Retention.REQUIRED


def user_block(
    block_id: str, kind: BlockKind, retention: Retention, priority: int, reason: str, text: str
) -> DraftBlock:
    """A block of one user message that no record carries (a note the runtime writes itself)."""
    return DraftBlock(
        block_id, kind, retention, priority, reason, [], [ChatMessage(role="user", content=text)]
    )


def _raw_calls(records: Sequence[LedgerRecord]) -> list[tuple[str, str]]:
    """``(call id as recorded, tool name)`` of a group's calls (its first record's), in call order."""
    body = records[0].body if records else None
    if not isinstance(body, AssistantMessagePayload):
        return []
    return [(c.call_id, c.name) for c in body.tool_calls]


def _count_ids(
    records: Sequence[LedgerRecord], messages: Sequence[ChatMessage], counter: TokenCounter
) -> int:
    """Tokens of the ids sent with ``messages`` that their records' counts miss.

    A tool message's ``tool_call_id`` is not part of its record's count; an inherited call's id is
    sent tagged with its thread (``c1@tag``) but was counted untagged.
    """
    extra = 0
    for m in messages:
        if m.tool_call_id is not None:
            extra += counter.count(m.tool_call_id)
        raw = [cid for cid, _ in _raw_calls(records)] if m.tool_calls else []
        for call, raw_id in zip(m.tool_calls or (), raw, strict=False):
            if raw_id != call.id:
                extra += counter.count(call.id) - counter.count(raw_id)
    return extra


def _outcome_keys(records: tuple[LedgerRecord, ...]) -> tuple[tuple[tuple[str, str, str], int], ...]:
    names = dict(_raw_calls(records))
    return tuple(
        ((names.get(r.body.call_id, ""), r.body.status.value, r.text), r.seq)
        for r in records
        if isinstance(r.body, ToolOutcomePayload)
    )


@dataclass
class _Group:
    """A tool group while a build attaches its outcomes: the build's own scratch, never kept."""

    head: DraftBlock
    # Per call id as the view names it: its place in the call order, or, once answered, -1 - arrival.
    waiting: dict[str, int]
    records: list[LedgerRecord]
    messages: list[ChatMessage]
    error_calls: set[str] = field(default_factory=set)


def _seq(record: LedgerRecord) -> int:
    return record.seq


@dataclass(frozen=True)
class BlockSet:
    """A thread's records as blocks: what the view shows, holds back, and has covered by a summary;
    and what they were built from, so a later build can extend them (``build_view_blocks``)."""

    ready: tuple[DraftBlock, ...]
    held: tuple[DraftBlock, ...]
    pending: tuple[PendingCall, ...]
    covered: tuple[DraftBlock, ...]
    # The run's task (``run_task_seq``) of the records the blocks were built from.
    run_task: int | None = None
    # What decides every block: the records, the seqs a summary covers and whose view it is.
    records: tuple[LedgerRecord, ...] = ()
    coverage: range = range(0, 1)
    own_thread: str = ""
    # The latest user input shown (the current request), and whether the records' seqs ascend: what
    # extending these blocks by records appended after them needs (``_extend``).
    last_user: int | None = None
    ascending: bool = False


def build_view_blocks(
    records: Sequence[LedgerRecord],
    covered_to: int = 0,
    *,
    covered_from: int = 0,
    own_thread: str = "",
    previous: BlockSet | None = None,
) -> BlockSet:
    """Blocks of a thread whose interactions ``covered_from..covered_to`` are replaced by a summary.

    Coverage is decided per block (by its first record), so an outcome recorded after the covered
    range still belongs to its covered group. Instructions, the current request, material and open
    groups are never covered: they are shown from their own records. Nor is what precedes the range:
    a request that was current when the summary was made stays out of it, and must be shown once a
    newer request takes its place.

    ``previous``: an earlier build of this thread's view. When it was built from the first records of
    ``records`` under the same coverage, its blocks are kept and only what the appended records
    change is built (``_extend``); otherwise everything is built. Either way the blocks are the same.
    """
    covered = range(covered_from, covered_to + 1)
    shown = tuple(records)
    if previous is not None and previous.coverage == covered and previous.own_thread == own_thread:
        n = len(previous.records)
        # Compared as tuples: the same record objects pass on identity, equal reloaded ones on value.
        if n <= len(shown) and previous.records == shown[:n]:
            if n == len(shown):
                return previous
            extended = _extend(shown, previous, covered, own_thread)
            if extended is not None:
                return extended
    run_task = run_task_seq(shown, own_thread)
    shown_records = _uncovered(shown, covered, own_thread) if covered_to else shown
    ready, held, pending = build_blocks(shown_records, own_thread=own_thread)
    return BlockSet(
        ready=tuple(b for b in ready if not _is_covered(b, covered)),
        held=tuple(held),
        pending=tuple(pending),
        covered=tuple(b for b in ready if _is_covered(b, covered)),
        run_task=run_task,
        records=shown,
        coverage=covered,
        own_thread=own_thread,
        last_user=_last_user(shown_records),
        ascending=ascending_by_seq(shown),
    )


def _last_user(records: Sequence[LedgerRecord]) -> int | None:
    return max((r.seq for r in records if r.kind is EventKind.USER_INPUT), default=None)


def _extend(
    records: tuple[LedgerRecord, ...], before: BlockSet, covered: range, own_thread: str
) -> BlockSet | None:
    """The blocks of ``records`` from ``before``, built from their first records, or ``None`` when the
    appended records change more than their own blocks and the whole build must run.

    A block is what its records and its place make of them, and an appended record changes the place
    of only two kinds of earlier blocks: a new user input ends the current turn (the blocks from the
    previous request on are no longer the current turn), and an outcome completes an open group. So
    the blocks before the earlier of those two points are kept as they are, and the records from it
    on are built again with the same code as a whole build, which for the same records gives the
    same blocks (``tests/unit/test_view_blocks.py`` holds both to one result record by record). What
    else an appended record could move, it never does here: an instruction, a thread's first
    question, an inherited record, or seqs out of order fall back to the whole build.
    """
    n = len(before.records)
    tail = records[n:]
    if not before.ascending or (n and tail[0].seq <= records[n - 1].seq) or not ascending_by_seq(tail):
        return None
    last_user = before.last_user
    start = tail[0].seq
    for record in tail:
        if record.kind is EventKind.SYSTEM or _foreign(record, own_thread):
            return None
        if before.run_task is None and counts_as_turn(record.body):
            return None  # the run's task appears: every block's place may change
        if record.kind is EventKind.USER_INPUT:
            if last_user is None:
                return None
            start = min(start, last_user)
            last_user = record.seq
    if before.held:
        start = min(start, min(b.records[0].seq for b in before.held))
    run_task = before.run_task
    pinned = {last_user, run_task}
    # The records from ``start`` on, as a whole build would take them (_uncovered, build_blocks).
    i = len(records)
    while i and records[i - 1].seq >= start:
        i -= 1
    again = [r for r in records[i:] if r.kind is not EventKind.SYSTEM and _shown(r, covered, pinned)]
    if any(_foreign(r, own_thread) for r in again):
        return None
    rebuilt, held, pending = _close_groups(_history_blocks(again, last_user, run_task, own_thread))
    fresh = sorted(rebuilt, key=_order)

    def kept(blocks: tuple[DraftBlock, ...]) -> list[DraftBlock]:
        return [b for b in blocks if b.kind is BlockKind.INSTRUCTION or b.records[0].seq < start]

    return BlockSet(
        ready=tuple(
            sorted([*kept(before.ready), *(b for b in fresh if not _is_covered(b, covered))], key=_order)
        ),
        held=tuple(held),
        pending=tuple(pending),
        covered=tuple(
            sorted([*kept(before.covered), *(b for b in fresh if _is_covered(b, covered))], key=_order)
        ),
        run_task=run_task,
        records=records,
        coverage=covered,
        own_thread=own_thread,
        last_user=last_user,
        ascending=True,
    )


def _never_covered(kind: EventKind) -> bool:
    """Instructions and material are shown from their own records whatever a summary covers."""
    match kind:
        case (
            EventKind.SYSTEM
            | EventKind.RESOURCE_ACTIVATED
            | EventKind.CHILD_RESULT
            | EventKind.CONTEXT_EXPORT
        ):
            return True
        case (
            EventKind.USER_INPUT
            | EventKind.ASSISTANT_MESSAGE
            | EventKind.TOOL_OUTCOME
            | EventKind.RUN_STATUS
            | EventKind.CONTEXT_RESET
            | EventKind.STATE_PATCH
            | EventKind.OPERATION_RECONCILE
            | EventKind.PHASE_CHANGE
        ):
            return False
        case _:
            assert_never(kind)


# Looked up per record on every prepare: a set, decided once by the exhaustive rule above.
_NEVER_COVERED = frozenset(k for k in EventKind if _never_covered(k))


def run_task_seq(records: Sequence[LedgerRecord], own_thread: str = "") -> int | None:
    """The seq of the run's task: the first question of the thread's own run, if any.

    Supplements and answers to the agent's questions are not the task; inherited records (other
    runs, a parent) are someone else's task.
    """
    # A minimum, not a sort: this runs on every prepare, over every record of the view.
    return min(
        (r.seq for r in records if counts_as_turn(r.body) and not _foreign(r, own_thread)),
        default=None,
    )


def _uncovered(records: Sequence[LedgerRecord], covered: range, own_thread: str = "") -> list[LedgerRecord]:
    """Skip what a summary covers before building blocks, so a long covered history costs nothing.

    Kept: everything outside the ``covered`` seqs, records that are never covered (instructions, material),
    the current request and the run's task. An outcome after the range whose call was covered
    finds no group and is dropped with it, as its covered group would be.
    """
    pinned = {_last_user(records), run_task_seq(records, own_thread)}
    return [r for r in records if _shown(r, covered, pinned)]


def _shown(record: LedgerRecord, covered: range, pinned: set[int | None]) -> bool:
    """Whether a summary covering the ``covered`` seqs leaves ``record`` to be shown (``_uncovered``)."""
    return record.seq not in covered or record.kind in _NEVER_COVERED or record.seq in pinned


def _is_covered(block: DraftBlock, covered: range) -> bool:
    return block.kind is BlockKind.INTERACTION and block.records[0].seq in covered


def build_blocks(
    records: Sequence[LedgerRecord], *, own_thread: str = ""
) -> tuple[list[DraftBlock], list[DraftBlock], list[PendingCall]]:
    """``(blocks in model order, open groups held back, pending calls)`` of a view's records.

    Records inherited from other threads keep their own call ids apart (``call_id@thread-tag``) so
    two runs' ``c1`` never meet; an inherited call that never got its result becomes a state block
    "result unknown" — never half a protocol group, never something to execute again.
    """
    last_user = _last_user(records)
    run_task = run_task_seq(records, own_thread)
    blocks: list[DraftBlock | _Group] = [_instruction_block(r) for r in records if r.kind is EventKind.SYSTEM]
    history = [r for r in records if r.kind is not EventKind.SYSTEM]
    blocks += _history_blocks(history, last_user, run_task, own_thread)
    ready, held, pending = _close_groups(blocks)
    inherited_open = [b for b in held if _foreign(b.records[0], own_thread)]
    held = [b for b in held if not _foreign(b.records[0], own_thread)]
    pending = [p for p in pending if not any(p.seq == b.records[0].seq for b in inherited_open)]
    ready = sorted([*ready, *(_unknown_result_block(b) for b in inherited_open)], key=_order)
    return ready, held, pending


def _history_blocks(
    history: Sequence[LedgerRecord],
    last_user: int | None,
    run_task: int | None,
    own_thread: str,
) -> list[DraftBlock | _Group]:
    """The blocks of history records (no instructions), outcomes attached to their groups."""
    blocks: list[DraftBlock | _Group] = []
    groups: dict[tuple[str, str], _Group] = {}
    for record in history:
        body = record.body
        match body:
            case (
                ContextResetPayload()
                | StatePatchPayload()
                | OperationReconcilePayload()
                | PhaseChangePayload()
            ):
                continue  # the origin boundary and state changes are not messages; state is projected apart
            case ToolOutcomePayload():
                _attach_outcome(record, body, groups, own_thread)
                continue
            case SystemPayload():
                continue  # pinned apart, before all history (build_blocks)
            case (
                UserInputPayload()
                | AssistantMessagePayload()
                | RunStatusPayload()
                | ContextExportPayload()
                | ResourceActivatedPayload()
                | ChildResultPayload()
            ):
                pass
            case _:
                assert_never(body)
        current_turn = last_user is not None and record.seq > last_user
        if record.seq == run_task and record.seq != last_user:
            blocks.append(_run_task_block(record))
            continue
        block = _history_block(record, last_user, current_turn, own_thread)
        if isinstance(block, _Group):
            for call_id in _recorded_ids(block.head).values():
                groups[(record.thread_id, call_id)] = block
        blocks.append(block)
    return blocks


def _order(block: DraftBlock) -> tuple[int, int]:
    # Instructions first, everything else in ledger order (state blocks take their call's place).
    return (0 if block.kind is BlockKind.INSTRUCTION else 1, block.records[0].seq)


def _foreign(record: LedgerRecord, own_thread: str) -> bool:
    return bool(own_thread) and bool(record.thread_id) and record.thread_id != own_thread


def _call_tag(thread_id: str) -> str:
    return hashlib.sha1(thread_id.encode()).hexdigest()[:6]


def _view_call_id(record: LedgerRecord, call_id: str, own_thread: str) -> str:
    """The id a call has in this view: its own, or tagged with its thread when inherited."""
    return f"{call_id}@{_call_tag(record.thread_id)}" if _foreign(record, own_thread) else call_id


def _recorded_ids(block: DraftBlock) -> dict[str, str]:
    """A group's call ids as shown (tagged when inherited) → as recorded, in call order.

    Read from the record, never parsed back from the shown id: a recorded id may contain "@".
    """
    body = block.records[0].body
    assert isinstance(body, AssistantMessagePayload)
    shown = block.messages[0].tool_calls or ()
    return {c.id: r.call_id for c, r in zip(shown, body.tool_calls, strict=True)}


def _unknown_result_block(block: DraftBlock) -> DraftBlock:
    record = block.records[0]
    calls = block.messages[0].tool_calls or ()
    lines = [
        f"[state: {len(calls)} tool call(s) of thread {record.thread_id} "
        f"(record {record.thread_seq}) never got a result. "
        "Result unknown; they are history and will not be executed again.]"
    ]
    recorded = _recorded_ids(block)
    lines += [
        f"- {c.function.name}({c.function.arguments}) call {recorded[c.id]}: result unknown" for c in calls
    ]
    return DraftBlock(
        block_id=f"state:{record.seq}",
        kind=BlockKind.STATE,
        retention=Retention.COMPRESSIBLE,
        priority=2,
        reason="inherited call without a result: shown as state, never as half a tool group",
        records=block.records,
        messages=[ChatMessage(role="user", content="\n".join(lines))],
    )


def _instruction_block(record: LedgerRecord) -> DraftBlock:
    return DraftBlock(
        block_id=f"instruction:{record.seq}",
        kind=BlockKind.INSTRUCTION,
        retention=Retention.REQUIRED,
        priority=0,
        reason="agent instructions: pinned first, required",
        records=[record],
        messages=[ChatMessage(role="system", content=record.text)],
    )


def _user_message(record: LedgerRecord) -> ChatMessage:
    return ChatMessage(role="user", content=record.text)


def _run_task_block(record: LedgerRecord) -> DraftBlock:
    # A task block, not an interaction: the compactor never covers it, so it stays verbatim.
    return DraftBlock(
        f"task:{record.seq}",
        BlockKind.TASK,
        Retention.REQUIRED,
        0,
        "the run's task: the question that started the run, pinned verbatim, required",
        [record],
        [_user_message(record)],
    )


def _history_block(
    record: LedgerRecord,
    last_user: int | None,
    current_turn: bool,
    own_thread: str = "",
) -> DraftBlock | _Group:
    retention, priority = (Retention.ACTIVE, 1) if current_turn else (Retention.COMPRESSIBLE, 2)
    turn = "in the current turn" if current_turn else "from an earlier turn"
    body = record.body
    match body:
        case UserInputPayload():
            if record.seq == last_user:
                return DraftBlock(
                    f"task:{record.seq}",
                    BlockKind.TASK,
                    Retention.REQUIRED,
                    0,
                    "the current request: the latest user input, required",
                    [record],
                    [_user_message(record)],
                )
            return DraftBlock(
                f"turn:{record.seq}",
                BlockKind.INTERACTION,
                retention,
                priority,
                f"user input {turn}",
                [record],
                [_user_message(record)],
            )
        case AssistantMessagePayload():
            return _assistant_block(record, body, retention, priority, turn, own_thread)
        case RunStatusPayload():
            text = f"[state: run {record.thread_id.split('.')[0]} ended {body.status}" + (
                f": {record.text}]" if record.text else "]"
            )
            return DraftBlock(
                f"state:{record.seq}",
                BlockKind.STATE,
                retention,
                priority,
                "how an earlier run ended (execution state)",
                [record],
                [ChatMessage(role="user", content=text)],
            )
        case ContextExportPayload():
            return DraftBlock(
                f"material:{record.seq}",
                BlockKind.MATERIAL,
                Retention.ACTIVE,
                1,
                "background the parent exported to this child, quoted as material (never instruction)",
                [record],
                [
                    ChatMessage(
                        role="user", content="[material: background from the parent agent]\n" + record.text
                    )
                ],
            )
        case ResourceActivatedPayload() | ChildResultPayload():
            what = (
                "activated resource" if isinstance(body, ResourceActivatedPayload) else "child agent result"
            )
            return DraftBlock(
                f"material:{record.seq}",
                BlockKind.MATERIAL,
                Retention.ACTIVE,
                1,
                f"{what}, quoted as material (never instruction)",
                [record],
                [ChatMessage(role="user", content=record_content(body, record.text))],
            )
        case (
            SystemPayload()
            | ToolOutcomePayload()
            | ContextResetPayload()
            | StatePatchPayload()
            | OperationReconcilePayload()
            | PhaseChangePayload()
        ):
            # build_blocks handles these before any history block is built.
            raise AssertionError(f"record {record.seq} ({record.kind}) is not a history block")
        case _:
            assert_never(body)


def _assistant_block(
    record: LedgerRecord,
    body: AssistantMessagePayload,
    retention: Retention,
    priority: int,
    turn: str,
    own_thread: str = "",
) -> DraftBlock | _Group:
    if not body.tool_calls:
        return DraftBlock(
            f"turn:{record.seq}",
            BlockKind.INTERACTION,
            retention,
            priority,
            f"model message {turn}",
            [record],
            [ChatMessage(role="assistant", content=record.text)],
        )
    message = _calls_message(record, body, own_thread)
    calls = message.tool_calls or ()
    head = DraftBlock(
        f"group:{record.seq}",
        BlockKind.INTERACTION,
        retention,
        priority,
        f"tool group {turn}: {len(calls)} call(s) with all their results, kept whole",
        [record],
        [message],
    )
    return _Group(head, {c.id: i for i, c in enumerate(calls)}, [record], [message])


def _calls_message(record: LedgerRecord, body: AssistantMessagePayload, own_thread: str) -> ChatMessage:
    calls = tuple(
        ChatToolCall(
            id=_view_call_id(record, c.call_id, own_thread),
            function=ChatFunction(name=c.name, arguments=arguments_json(c.args)),
        )
        for c in body.tool_calls
    )
    return ChatMessage(role="assistant", content=record.text or None, tool_calls=calls)


def _attach_outcome(
    record: LedgerRecord,
    body: ToolOutcomePayload,
    groups: dict[tuple[str, str], _Group],
    own_thread: str = "",
) -> None:
    call_id = body.call_id
    group = groups.pop((record.thread_id, call_id), None)
    if group is None:
        return
    view_id = _view_call_id(record, call_id, own_thread)
    group.records.append(record)
    group.waiting[view_id] = -1 - len(group.records)  # mark as answered, remember arrival
    group.messages.append(
        ChatMessage(role="tool", tool_call_id=view_id, content=record_content(body, record.text))
    )
    if body.status is not ToolStatus.SUCCESS:
        group.error_calls.add(view_id)


def _close_groups(
    blocks: list[DraftBlock | _Group],
) -> tuple[list[DraftBlock], list[DraftBlock], list[PendingCall]]:
    ready: list[DraftBlock] = []
    held: list[DraftBlock] = []
    pending: list[PendingCall] = []
    for block in blocks:
        if isinstance(block, DraftBlock):
            ready.append(block)
            continue
        head = block.head
        open_calls = [cid for cid, slot in block.waiting.items() if slot >= 0]
        if open_calls:
            call_names = {c.id: c.function.name for c in head.messages[0].tool_calls or ()}
            recorded = _recorded_ids(head)
            pending.extend(
                PendingCall(call_id=recorded[c], name=call_names[c], seq=head.records[0].seq)
                for c in open_calls
            )
            waiting = f"waiting for {len(open_calls)} of {len(block.waiting)} result(s)"
            held.append(
                replace(
                    head,
                    reason=f"open tool group: {waiting}",
                    records=block.records,
                    messages=block.messages,
                    error_calls=frozenset(block.error_calls),
                )
            )
            continue
        ready.append(_closed(block))
    return ready, held, pending


def _closed(group: _Group) -> DraftBlock:
    """A group with all its outcomes: tool messages in the order of the calls, whatever order the
    results arrived in."""
    head, tools = group.messages[0], group.messages[1:]
    order = {c.id: i for i, c in enumerate(head.tool_calls or ())}
    return replace(
        group.head,
        records=group.records,
        messages=[head, *sorted(tools, key=lambda m: order[m.tool_call_id or ""])],
        error_calls=frozenset(group.error_calls),
    )


def id_tokens(block: DraftBlock, counter: TokenCounter | None) -> int:
    """What a record's count (fixed at recording) misses of the ids sent with the block's messages,
    as the block counted it when built (``DraftBlock.id_counts``). The estimate profile counts whole
    dumped messages, ids included. The assembly and the compaction measure both count it, so that a
    view measures what its context counts.
    """
    return block.id_counts.get(counter.name) if counter is not None else 0
