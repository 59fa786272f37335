"""Served history: a served context's manifest and texts, the diff between steps and its reasons, the
gateway's write-behind keeping it, and the chart drawn from it."""

from __future__ import annotations

import re

import pytest

from contracts import SummaryRef
from services.app.final_checks import GatewayService
from services.core.served import ServedBlock, ServedContext, diff_served, served_of
from services.store.final_checks import MemoryGatewayStore, MemoryHookGrants
from tests.fixtures.builders import Thread, assembled
from workers.console.chart import ChartLine, ChartMark, ChartStep, timeline_svg

pytestmark = pytest.mark.anyio


def _two_steps() -> tuple[ServedContext, ServedContext, dict[str, str]]:
    t = Thread()
    first = [t.system("You are careful."), t.user("Rename the module.")]
    second = [*first, t.assistant("Looking at it."), t.user("Also update the imports.")]
    before, _ = served_of(assembled(t, first, budget_tokens=20_000), "default")
    after, texts = served_of(assembled(t, second, budget_tokens=20_000), "default")
    return before, after, texts


def _block(block_id: str, sources: tuple[int, ...], digest: str, tokens: int = 10) -> ServedBlock:
    return ServedBlock(
        block_id=block_id,
        kind="interaction",
        retention="compressible",
        reason="history",
        sources=sources,
        tokens=tokens,
        digest=digest,
    )


def test_served_of_keeps_each_blocks_text_under_its_digest_and_the_manifest_holds_no_text() -> None:
    _, after, texts = _two_steps()
    assert {b.digest for b in after.blocks} == set(texts)
    assert any("Also update the imports." in text for text in texts.values())
    assert "Also update the imports." not in after.model_dump_json()


def test_diff_served_of_the_first_step_adds_every_block_as_first() -> None:
    _, after, _ = _two_steps()
    diff = diff_served(None, after)
    assert [(c.change, c.reason) for c in diff.changes] == [("added", "first")] * len(after.blocks)
    assert diff.stable_prefix_tokens == 0


def test_diff_served_adds_the_blocks_of_new_records_and_keeps_the_identical_prefix_stable() -> None:
    before, after, _ = _two_steps()
    diff = diff_served(before, after)
    added = [c for c in diff.changes if c.change == "added"]
    assert added and {c.reason for c in added} == {"new_records"}
    assert all(max(c.block.sources) > before.thread_seq for c in added)
    system = after.blocks[0]
    assert system.kind == "instruction" and diff.stable_prefix_blocks >= 1
    assert diff.stable_prefix_tokens >= system.tokens


def test_diff_served_attributes_what_a_summary_covers_to_that_compaction_and_new_blocks_to_records() -> None:
    kept, old, newer = _block("b1", (1,), "d1"), _block("b2", (2, 3), "d2"), _block("b5", (5,), "d5")
    summary, fresh = _block("summary", (2, 3), "ds"), _block("b6", (6,), "d6")
    before = _context(blocks=(kept, old, newer), thread_seq=5)
    summary_ref = SummaryRef(summary_id="s1", view_revision=1, covered_from=2, covered_to=3, sources=(2, 3))
    after = before.model_copy(
        update={
            "view_revision": 1,
            "summary": summary_ref,
            "blocks": (kept, summary, newer, fresh),
            "thread_seq": 6,
        }
    )
    diff = diff_served(before, after)
    assert [(c.change, c.block.block_id, c.reason) for c in diff.changes] == [
        ("added", "summary", "compaction"),
        ("added", "b6", "new_records"),
        ("removed", "b2", "compaction"),
    ]
    assert "summarized (#2–#3)" in diff.changes[2].detail
    assert (diff.kept, diff.stable_prefix_blocks, diff.stable_prefix_tokens) == (2, 1, 10)


def test_diff_served_says_rollover_when_the_window_changed() -> None:
    before = _context(blocks=(_block("b1", (1,), "d1"),), thread_seq=1)
    after = before.model_copy(update={"window": 2, "blocks": (_block("handoff", (1,), "dh"),)})
    assert {c.reason for c in diff_served(before, after).changes} == {"rollover"}


def test_diff_served_names_a_changed_block_with_its_reduction() -> None:
    before = _context(blocks=(_block("b1", (1,), "full", tokens=900),), thread_seq=1)
    after = before.model_copy(
        update={"reductions": ("masked",), "blocks": (_block("b1", (1,), "masked", tokens=40),)}
    )
    (change,) = diff_served(before, after).changes
    assert (change.change, change.reason, change.detail) == ("changed", "reduction", "masked")
    assert change.before is not None and change.before.tokens == 900


def _context(*, blocks: tuple[ServedBlock, ...], thread_seq: int) -> ServedContext:
    _, after, _ = _two_steps()
    return after.model_copy(
        update={"blocks": blocks, "thread_seq": thread_seq, "reductions": (), "hooks": ()}
    )


async def test_write_behind_keeps_served_steps_in_order_and_each_block_text_once() -> None:
    t = Thread()
    first = [t.system("You are careful."), t.user("Rename the module.")]
    second = [*first, t.assistant("Looking at it."), t.user("Also update the imports.")]
    store = MemoryGatewayStore()
    service = GatewayService(store, MemoryHookGrants())
    for events in (first, second, first):  # the third is the first again: the same prepared id
        service.remember(assembled(t, events, budget_tokens=20_000), "default")
        await service.flush()
    steps = store.served[t.thread_id]
    assert len(steps) == 2
    digests = {b.digest for s in steps for b in s.served.blocks}
    assert {d for (thread, d) in store.served_texts if thread == t.thread_id} == digests


def test_timeline_svg_draws_a_109k_budget_with_round_labels_and_bars_a_person_can_see() -> None:
    steps = [
        ChartStep(n, {"instructions": 3_000, "tool_schemas": 2_000, "history": 6_000 * n})
        for n in range(1, 13)
    ]
    lines = [ChartLine("budget", 109_000, "#111"), ChartLine("trigger", 87_200, "#b45309", dashed=True)]
    svg = timeline_svg(steps, lines, [ChartMark(9, "compaction 1 <v>", "compaction")])
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    labels = re.findall(r'text-anchor="end">([^<]+)</text>', svg)
    assert labels[0] == "0" and "100k" in labels
    heights = [float(h) for h in re.findall(r'class="seg history"[^>]*height="([0-9.]+)"', svg)]
    assert len(heights) == 12 and min(heights) > 10  # 6,000 tokens of a 109k scale stay visible
    widths = {float(w) for w in re.findall(r'class="seg [a-z_]+"[^>]*width="([0-9.]+)"', svg)}
    assert min(widths) > 20
    assert 'data-name="trigger" data-tokens="87200"' in svg
    assert "compaction 1 &lt;v&gt;" in svg and "<v>" not in svg
