"""``ctxfleet context``: a prepared context as a breakdown, the way Claude Code's ``/context`` shows one.

:func:`breakdown` is pure (a ``PreparedContext`` in, figures out): per category and per block the
tokens and their share of the input budget, why each block is there, what was left out and why, and
what the summary covers and which hooks shaped it, the context hooks that ran with their notes,
and (``--text``) each block's text as the model reads it.
:func:`render` draws it in a terminal; ``as_json`` is the ``--json`` form.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, assert_never

from rich.console import Console
from rich.table import Table
from rich.text import Text

from contracts import BlockKind, PreparedContext, RecordRef, SummaryHook
from services.core.assemble import added_tokens
from services.core.block_text import BlockText, block_texts

__all__ = [
    "BlockLine",
    "Category",
    "CategoryLine",
    "ContextBreakdown",
    "HookLine",
    "OmittedLine",
    "PLAIN_WIDTH",
    "SummaryHookLine",
    "SummaryLine",
    "breakdown",
    "category_of",
    "render",
    "summary_hook_text",
    "whole_history_text",
]

Category = Literal["instructions", "tool_schemas", "history", "materials", "summaries", "envelopes"]
# In the order the bar draws them, each with its colour; free space comes last.
_CATEGORIES: tuple[tuple[Category, str], ...] = (
    ("instructions", "magenta"),
    ("tool_schemas", "cyan"),
    ("history", "green"),
    ("materials", "yellow"),
    ("summaries", "blue"),
    ("envelopes", "bright_black"),
)
_BAR_CELLS = 50


def category_of(kind: BlockKind) -> Category:
    """The budget category a block's tokens count under (as the assembly itemizes them)."""
    match kind:
        case BlockKind.INSTRUCTION:
            return "instructions"
        case BlockKind.TASK | BlockKind.INTERACTION | BlockKind.STATE:
            return "history"
        case BlockKind.MATERIAL:
            return "materials"
        case BlockKind.SUMMARY:
            return "summaries"
        case _:
            assert_never(kind)


@dataclass(frozen=True, slots=True)
class CategoryLine:
    """One budget category: its tokens and share of the input budget (percent)."""

    name: str
    tokens: int
    share: float


@dataclass(frozen=True, slots=True)
class BlockLine:
    """One block in the context, and why it is there."""

    block_id: str
    kind: str
    category: str
    retention: str
    priority: int
    droppable: bool
    tokens: int
    share: float
    messages: int
    records: str
    reason: str


@dataclass(frozen=True, slots=True)
class OmittedLine:
    """One block left out, and why."""

    block_id: str
    kind: str
    tokens: int
    records: str
    reason: str


@dataclass(frozen=True, slots=True)
class HookLine:
    """A context hook that ran for this context: where, what came of it, and its note or annotation."""

    source: str
    point: str
    outcome: str
    note: str


@dataclass(frozen=True, slots=True)
class SummaryHookLine:
    """A compaction hook that narrowed or patched the summary, as recorded with it."""

    source: str
    point: str
    subject: str
    release: str
    hook_set_revision: int
    change: str


@dataclass(frozen=True, slots=True)
class SummaryLine:
    """The committed summary the context shows in place of the history it covers."""

    summary_id: str
    view_revision: int
    covered_from: int
    covered_to: int
    # The records it covers (``covered_from``–``covered_to``), and those it cites, which may include
    # a record shown in full beside it (the run's task).
    records: int
    cited: int
    hooks: tuple[SummaryHookLine, ...] = ()


@dataclass(frozen=True, slots=True)
class ContextBreakdown:
    """Everything ``ctxfleet context`` shows about one prepared context."""

    thread_id: str
    session_id: str
    prepared_id: str
    policy: str
    profile: str
    input_budget: int
    used: int
    free: int
    estimated_input: int
    counting_method: str
    view_revision: int
    messages: int
    categories: tuple[CategoryLine, ...]
    blocks: tuple[BlockLine, ...]
    omitted: tuple[OmittedLine, ...]
    summary: SummaryLine | None
    reductions: tuple[str, ...]
    pending_calls: tuple[str, ...]
    hooks: tuple[HookLine, ...] = ()
    # Where the budget came from (the session's policy, or what was asked), and what the runtime's
    # prepare would do first that showing the context did not.
    budget_source: str = ""
    runtime_would: tuple[str, ...] = ()
    # Each block's text as the model reads it (``--text``).
    texts: tuple[BlockText, ...] = ()
    # The thread's whole history as ``ctxfleet compact`` counts it (``ContextShown.history_tokens``;
    # ``None`` for a context read from a file), and what this context's request and hooks added beside it.
    history: int | None = None
    added: int = 0

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def breakdown(
    prepared: PreparedContext,
    *,
    budget_source: str = "",
    runtime_would: tuple[str, ...] = (),
    texts: bool = False,
    history: int | None = None,
) -> ContextBreakdown:
    """The figures of ``prepared``; shares are of its input budget, in percent to one decimal.

    ``texts``: with each block's text too; ``history``: the thread's whole history, as the fleet
    measured it beside the context (``ContextShown.history_tokens``).
    """
    report = prepared.budget_report
    budget = report.input_budget

    def share(tokens: int) -> float:
        return round(100 * tokens / budget, 1) if budget else 0.0

    used = report.used
    categories = tuple(
        CategoryLine(name, getattr(used, name), share(getattr(used, name))) for name, _ in _CATEGORIES
    )
    blocks = tuple(
        BlockLine(
            block_id=b.block_id,
            kind=b.kind.value,
            category=category_of(b.kind),
            retention=b.retention.value,
            priority=b.priority,
            droppable=b.droppable,
            tokens=b.tokens,
            share=share(b.tokens),
            messages=b.message_count,
            records=_span(b.sources),
            reason=b.reason,
        )
        for b in prepared.blocks
    )
    omitted = tuple(
        OmittedLine(o.block_id, o.kind.value, o.tokens, _span(o.sources), o.reason) for o in prepared.omitted
    )
    s = prepared.summary
    summary = (
        SummaryLine(
            s.summary_id,
            s.view_revision,
            s.covered_from,
            s.covered_to,
            s.covered_to - s.covered_from + 1,
            len(s.sources),
            tuple(
                SummaryHookLine(h.source, h.point, h.subject, h.release, h.hook_set_revision, h.change)
                for h in s.hooks
            ),
        )
        if s
        else None
    )
    return ContextBreakdown(
        thread_id=f"{prepared.run_id}.{prepared.instance_id}",
        session_id=prepared.session_id,
        prepared_id=prepared.prepared_id,
        policy=prepared.policy,
        profile=report.profile,
        input_budget=budget,
        used=used.total,
        free=max(0, budget - used.total),
        estimated_input=report.estimated_input,
        counting_method=report.counting_method,
        view_revision=prepared.view_revision,
        messages=len(prepared.messages),
        categories=categories,
        blocks=blocks,
        omitted=omitted,
        summary=summary,
        reductions=prepared.reductions,
        pending_calls=tuple(f"{p.name} ({p.call_id}, #{p.seq})" for p in prepared.pending_calls),
        hooks=tuple(HookLine(h.source, h.point or "-", h.outcome, h.note) for h in prepared.hooks),
        budget_source=budget_source,
        runtime_would=runtime_would,
        texts=tuple(block_texts(prepared)) if texts else (),
        history=history,
        added=added_tokens(prepared),
    )


def whole_history_text(history: int, added: int, used: int) -> str:
    """The thread's whole history against the context prepared from it, on one line (``ctxfleet context``
    and the console's context page)."""
    beside = f", {added:,} of them added by this prepare's hooks and evidence" if added else ""
    return (
        f"whole history {history:,} tokens (a repeated tool output counted once) → {used:,} prepared{beside}"
    )


def summary_hook_text(h: SummaryHook | SummaryHookLine) -> str:
    """One hook that shaped a summary, on one line (``ctxfleet context`` and ``ctxfleet inspect``)."""
    change = f": {h.change}" if h.change else ""
    return (
        f"{h.source} at {h.point} (subject {h.subject}, hook set {h.release} r{h.hook_set_revision}){change}"
    )


def _span(sources: tuple[RecordRef, ...]) -> str:
    """The session seqs a block was built from, as ``#3`` or ``#3–9`` (``-`` for none)."""
    if not sources:
        return "-"
    seqs = sorted(r.seq for r in sources)
    return f"#{seqs[0]}" if seqs[0] == seqs[-1] else f"#{seqs[0]}–{seqs[-1]}"


# Wide enough for the reasons when the output is not a terminal (a pager, a file, a test).
PLAIN_WIDTH = 120


def render(b: ContextBreakdown, console: Console) -> None:
    """Draw the breakdown: the budget bar with its legend, then the blocks, omissions and summary."""
    console.print(
        Text.assemble(
            ("Context ", "bold"),
            (b.thread_id, "bold cyan"),
            f"  session {b.session_id} · policy {b.policy or '-'} · profile {b.profile} · "
            f"view r{b.view_revision} · {b.messages} messages",
        )
    )
    if b.budget_source:
        console.print(f"budget from {b.budget_source}; nothing was written to show it", highlight=False)
    if b.history is not None:
        console.print(whole_history_text(b.history, b.added, b.used), highlight=False)
    for would in b.runtime_would:
        console.print(f"the runtime's prepare would {would}", highlight=False)
    console.print(_bar(b))
    legend = Table.grid(padding=(0, 2))
    for _ in range(3):
        legend.add_column(justify="right" if _ else "left")
    colours: dict[str, str] = dict(_CATEGORIES)
    for c in b.categories:
        legend.add_row(Text("■ ", style=colours[c.name]) + c.name, f"{c.tokens:,} tokens", f"{c.share:.1f}%")
    legend.add_row(
        Text("□ ") + "free",
        f"{b.free:,} tokens",
        f"{100 * b.free / b.input_budget:.1f}%" if b.input_budget else "-",
    )
    console.print(legend)
    console.print(
        f"{b.used:,} of {b.input_budget:,} tokens used ({b.counting_method}; estimated input "
        f"{b.estimated_input:,})",
        highlight=False,
    )
    blocks = Table(title="blocks", title_justify="left", expand=True)
    for head in ("block", "kind", "retention"):
        blocks.add_column(head, no_wrap=True)
    blocks.add_column("tokens", justify="right", no_wrap=True)
    blocks.add_column("%", justify="right", no_wrap=True)
    blocks.add_column("records", no_wrap=True)
    # The reason takes whatever width is left, wrapped: it is the column a person reads.
    blocks.add_column("why it is there", ratio=1, min_width=24, overflow="fold")
    for line in b.blocks:
        blocks.add_row(
            line.block_id,
            line.kind,
            line.retention,
            f"{line.tokens:,}",
            f"{line.share:.1f}",
            line.records,
            line.reason,
        )
    console.print(blocks)
    if b.omitted:
        left_out = Table(title="omitted", title_justify="left", expand=True)
        for head in ("block", "kind", "tokens", "records"):
            left_out.add_column(head, justify="right" if head == "tokens" else "left", no_wrap=True)
        left_out.add_column("why it was left out", ratio=1, min_width=24, overflow="fold")
        for o in b.omitted:
            left_out.add_row(o.block_id, o.kind, f"{o.tokens:,}", o.records, o.reason)
        console.print(left_out)
    else:
        console.print("omitted: nothing")
    if b.summary is not None:
        s = b.summary
        console.print(
            f"summary {s.summary_id} (view r{s.view_revision}) covers records "
            f"#{s.covered_from}–#{s.covered_to} ({s.records} records), citing {s.cited} records",
            highlight=False,
        )
        for shaped in s.hooks:
            console.print(f"  shaped by hook {summary_hook_text(shaped)}", highlight=False)
    else:
        console.print("summary: none (no compaction has committed for this thread)")
    if b.hooks:
        hooks = Table(title="hooks", title_justify="left", expand=True)
        for head in ("hook", "point", "outcome"):
            hooks.add_column(head, no_wrap=True)
        hooks.add_column("note", ratio=1, min_width=24, overflow="fold")
        for h in b.hooks:
            hooks.add_row(h.source, h.point, h.outcome, h.note or "-")
        console.print(hooks)
    if b.reductions:
        console.print(f"reductions: {', '.join(b.reductions)}", highlight=False)
    if b.pending_calls:
        console.print(f"pending calls (held back whole): {', '.join(b.pending_calls)}", highlight=False)
    for t in b.texts:
        cites = f", cites #{', #'.join(map(str, t.sources))}" if t.kind == "summary" and t.sources else ""
        console.rule(f"{t.block_id} · {t.kind} · {t.tokens:,} tokens{cites}", align="left")
        # As written: a record's text is never markup, and a person reads it whole here.
        console.print(Text(t.text), highlight=False)


def _bar(b: ContextBreakdown) -> Text:
    bar = Text()
    if b.input_budget <= 0:
        return bar
    colours: dict[str, str] = dict(_CATEGORIES)
    filled = 0
    for c in b.categories:
        # Round each category to whole cells, but never hide one that uses any tokens at all.
        cells = round(_BAR_CELLS * c.tokens / b.input_budget) or (1 if c.tokens else 0)
        cells = min(cells, _BAR_CELLS - filled)
        bar.append("█" * cells, style=colours[c.name])
        filled += cells
    bar.append("░" * (_BAR_CELLS - filled), style="bright_black")
    bar.append(f"  {b.used:,}/{b.input_budget:,} tokens ({100 * b.used / b.input_budget:.0f}%)")
    return bar
