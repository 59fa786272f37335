"""The one count of a view: what the compaction measure counts is what a context of the view uses.

Pure, and a bundled sample recorded in memory by the recorder's service."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts import CompactionPolicy, ContextPolicy, PreparedContext, PrepareRequest
from contracts.subjects import DEFAULT_TENANT
from infra import SAMPLES_DIR
from services.app.budgeting import measure
from services.app.views import ViewLoader
from services.core.assemble import SummaryView, ThreadSnapshot, assemble_context, shown_blocks, view_sizes
from services.core.budget import resolve_budget
from services.core.compaction.select import measure_view
from services.core.groups import build_view_blocks
from services.core.render import REPLY_PRIMING
from services.core.state import Fact
from services.core.tokens import counter_for
from services.core.trace import read_trace
from services.edge.replay import ReplayOptions, trace_events
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming, ledger_records
from tests.unit.test_shells_in_memory import _recorder

# Long enough to be shown as a reference when repeated, and to be a real part of the view.
LOG = "FAILED tests/test_app.py::test_import - ModuleNotFoundError: No module named 'app.utils'\n" * 12


def _snapshot(summary: SummaryView | None = None) -> ThreadSnapshot:
    """A thread that runs the same failing test three times (identical outputs) and holds a state fact."""
    t = Thread()
    events = [t.system("You fix bugs."), t.user("Fix the failing import.", key="task")]
    for n in range(3):
        events += [t.assistant(f"run {n}", calls=((f"c{n}", "bash", {"cmd": "pytest"}),))]
        events += [t.outcome(f"c{n}", LOG)]
    events += [t.assistant("reading app", calls=(("r", "cat", {"p": "app.py"}),)), t.outcome("r", "import x")]
    records = ledger_records(events)
    fact = Fact("task.goal", "fix the import", "known", "user", "task", 2, None)
    return ThreadSnapshot(
        t.session_id,
        t.run_id,
        t.instance_id,
        len(records),
        records[-1].seq,
        records[-1].event_key,
        records,
        facts=(fact,),
        summary=summary,
        covered_to=summary.covered_to if summary else 0,
    )


def _measured(snapshot: ThreadSnapshot) -> int:
    blocks = build_view_blocks(snapshot.records, snapshot.covered_to, covered_from=snapshot.covered_from)
    shown = shown_blocks(snapshot, blocks)
    sizes = view_sizes(shown, counter_for("o200k_base"), snapshot.summary)
    return measure_view(shown, sizes, blocks, CompactionPolicy(), 100_000)[0].estimated


def _used(snapshot: ThreadSnapshot) -> tuple[int, int]:
    t = snapshot
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=100_000
    )
    prepared = assemble_context(snapshot, request, resolve_budget(request), counter_for("o200k_base"))
    assert isinstance(prepared, PreparedContext)
    report = prepared.budget_report
    return report.used.total, report.reductions.deduplicated


def test_the_measure_of_a_view_that_repeats_an_output_is_what_its_context_uses() -> None:
    snapshot = _snapshot()

    used, deduplicated = _used(snapshot)

    assert deduplicated == 2  # the second and third runs are references to the first
    assert _measured(snapshot) == used
    # Counting every copy would have measured more than any context of the view sends.
    blocks = build_view_blocks(snapshot.records)
    every_copy = sum(
        view_sizes([b], counter_for("o200k_base"))[b.block_id] for b in shown_blocks(snapshot, blocks)
    )
    assert every_copy + REPLY_PRIMING > used


def test_the_measure_of_a_summarized_view_is_what_its_context_uses() -> None:
    text = "[context summary r1: records 3–4]\nThe test run failed on a missing module app.utils."
    counter = counter_for("o200k_base")
    summary = SummaryView("s1", 1, 3, 4, text, counter.count(text), 0, (3, 4))
    snapshot = _snapshot(summary)

    used, deduplicated = _used(snapshot)

    # The output the summary covers no longer stands in view: the next copy is shown whole, the last
    # as a reference to it.
    assert deduplicated == 1
    assert _measured(snapshot) == used
    assert _measured(replace(snapshot, summary=None, covered_to=0)) != used


# Bundled traces whose agents ran a command twice and read the same output again.
REPEATING = (
    "mini-swe-agent-deepseek__deepseek_chat_dev__sqlfluff__sqlfluff-2419.jsonl",
    "swe-agent__gpt4_pydicom__pydicom-1458.jsonl",
)


@pytest.mark.anyio
@pytest.mark.parametrize("sample", REPEATING)
async def test_the_budgeters_measure_of_a_recorded_sample_is_what_its_whole_context_uses(sample: str) -> None:
    store = MemoryStore()
    policy = ContextPolicy(name="roomy", model_profile=None, budget_tokens=1_000_000)
    await store.register_policy(DEFAULT_TENANT, policy)
    options = ReplayOptions(session_id="s1", model_profile=None, policy=policy.name)
    events = trace_events(read_trace(SAMPLES_DIR / sample), options)
    await _recorder(store).record_batch(0, incoming(events))
    async with store.connection() as s:
        view = await ViewLoader().load(s, events[-1].thread_id)
    snapshot = view.snapshot()
    request = PrepareRequest(
        session_id=snapshot.session_id,
        run_id=snapshot.run_id,
        instance_id=snapshot.instance_id,
        budget_tokens=1_000_000,
    )

    measured, _, _ = measure(view, view.records, budget=1_000_000, reserved=0)
    prepared = assemble_context(snapshot, request, resolve_budget(request), counter_for(view.encoding))

    assert isinstance(prepared, PreparedContext) and prepared.budget_report.reductions.deduplicated > 0
    assert measured.estimated == prepared.budget_report.used.total
