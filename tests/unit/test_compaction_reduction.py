"""A compaction whose summary would not make the view smaller: nothing is committed, and the reason says
why and what a person can do. In memory: the recorder's and compactor's services on ``MemoryStore``."""

from __future__ import annotations

import pytest

from contracts import CompactionPolicy, CompactRequest, ContextPolicy, PrepareRequest
from contracts.exceptions import CompactionFailed
from contracts.subjects import DEFAULT_TENANT
from services.app.compacting import CompactionService
from services.app.manual_compaction import ManualCompaction
from services.app.notices import NoticeBoard
from services.app.preparing import PrepareService
from services.app.views import ViewLoader
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming
from tests.unit.test_shells_in_memory import _recorder

pytestmark = pytest.mark.anyio

# Long instructions: ~1,200 tokens that every context must carry.
RULES = "Follow the repository's contribution rules to the letter before any change. " * 90


async def _thread(store: MemoryStore, t: Thread, budget: int, outputs: list[str]) -> None:
    """A thread under a policy of ``budget`` tokens: long instructions, a task, one group per output."""
    await store.register_policy(
        DEFAULT_TENANT,
        ContextPolicy(name="p", model_profile=None, budget_tokens=budget, compaction=CompactionPolicy()),
    )
    events = [t.system(RULES).model_copy(update={"policy": "p"}), t.user("Make the tests pass", key="task")]
    for i, output in enumerate(outputs):
        events.append(t.assistant(f"step {i}", calls=((f"c{i}", "bash", {"cmd": "pytest -x"}),)))
        events.append(t.outcome(f"c{i}", output))
    await _recorder(store).record_batch(0, incoming(events))


async def _compact(store: MemoryStore, t: Thread) -> CompactionFailed:
    loader = ViewLoader()
    manual = ManualCompaction(store, loader, CompactionService(store, loader))
    with pytest.raises(CompactionFailed) as failed:
        await manual.compact(
            CompactRequest(run_id=t.run_id, instance_id=t.instance_id), tenant=DEFAULT_TENANT
        )
    return failed.value


async def test_a_compaction_under_required_content_over_the_budget_fails_at_reduction_naming_the_fix() -> (
    None
):
    store, t = MemoryStore(), Thread()
    # Tiny outputs: a summary of them is longer than they are. The instructions alone exceed 800.
    await _thread(store, t, 800, [f"{i} passed" for i in range(4)])

    failed = await _compact(store, t)

    assert failed.details["stage"] == "reduction"
    assert "no real reduction" in failed.message
    assert (
        "exceeds the 800-token budget" in failed.message
        and "raise the policy's budget_tokens" in failed.message
    )
    # Nothing was committed: the thread is prepared as before, at a budget its instructions fit.
    ask = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=4_000
    )
    prepared = await PrepareService(store, NoticeBoard()).prepare(ask)
    assert prepared.summary is None and prepared.view_revision == 0


async def test_a_summary_leaving_copies_of_an_output_it_covers_in_view_counts_them_whole_again() -> None:
    store, t = MemoryStore(), Thread()
    # The same failing test, run eight times: the view shows its output once and seven references. A
    # summary of the first six leaves the newest two, which would then be shown whole.
    await _thread(store, t, 100_000, ["E   ModuleNotFoundError: No module named 'app'\n" * 30] * 8)

    failed = await _compact(store, t)

    assert failed.details["stage"] == "reduction"
    assert "of repeated tool outputs it leaves in view would be shown whole again" in failed.message
    assert "lower the policy's keep_recent_groups" in failed.message
