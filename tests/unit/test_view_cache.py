"""The view cache: what it keeps, what it evicts, and that a context it reuses is the one assembly gives.

Property: for random record sequences grown one step at a time (tool groups with repeated and failed
outputs, open groups closed later, answers, questions, material) and compaction swaps, under budgets
that make every reduction run, a prepare through the view cache kept across steps is byte-identical
to one assembled without it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts import PreparedContext, PrepareRequest
from services.app.budgeting import measure
from services.app.view_cache import ViewCache, assemble_reusing, last_blocks
from services.app.views import ViewLoader
from services.core.assemble import OverBudgetView, SummaryView, ThreadSnapshot, assemble_context
from services.core.budget import resolve_budget
from services.core.records import LedgerRecord
from services.core.tokens import counter_for
from contracts.exceptions import CtxError
from services.store.memory import MemoryStore
from tests.fixtures.builders import Thread, incoming, ledger_records

# Outputs drawn from a small pool, so identical outputs repeat (deduplication) and long ones mask.
_OUTPUTS = (
    "ok",
    "FAILED tests/test_app.py::test_import - ImportError: cannot import name 'x'\n" * 12,
    "def main():\n    return compute(1, 2)\n" * 40,
    "line of a long log file with numbers 1234567890\n" * 120,
)
_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["group", "group", "group", "open", "close", "answer", "user", "resource"]),
        st.integers(0, len(_OUTPUTS) - 1),
        st.booleans(),
    ),
    min_size=3,
    max_size=22,
)


def _events(t: Thread, steps: list[tuple[str, int, bool]]) -> list[Any]:
    events: list[Any] = [t.system("You fix bugs."), t.user("Fix the failing import.")]
    open_calls: list[str] = []
    for n, (kind, out, failed) in enumerate(steps):
        status = "error" if failed else "success"
        if kind == "group":
            calls = ((f"c{n}", "bash", {"cmd": f"cat f{out}.py"}),)
            if failed:
                calls += ((f"d{n}", "read", {"path": f"g{out}.py"}),)
            events.append(t.assistant(f"step {n}", calls=calls))
            events.extend(t.outcome(c, _OUTPUTS[out], status=status) for c, _, _ in reversed(calls))
        elif kind == "open":
            events.append(t.assistant("", calls=((f"o{n}", "bash", {"cmd": "pytest -x"}),)))
            open_calls.append(f"o{n}")
        elif kind == "close" and open_calls:
            events.append(t.outcome(open_calls.pop(0), _OUTPUTS[out], status=status))
        elif kind == "answer":
            events.append(t.assistant(f"answer {n}: " + "done. " * out * 20))
        elif kind == "user":
            events.append(t.user(f"also check module {n}"))
        elif kind == "resource":
            events.append(t.resource(f"doc{n}", "reference text " * (out * 30 + 1)))
    return events


def _snapshot(t: Thread, records: list[LedgerRecord], covered: int) -> ThreadSnapshot:
    summary = None
    if covered:
        text = f"[summary of records 1–{covered}] the agent inspected files and ran tests."
        summary = SummaryView(
            summary_id=f"sum-{covered}",
            view_revision=covered,
            covered_from=1,
            covered_to=covered,
            text=text,
            tokens_o200k=counter_for("o200k_base").count(text),
            tokens_cl100k=counter_for("cl100k_base").count(text),
            sources=(1, covered),
        )
    return ThreadSnapshot(
        t.session_id,
        t.run_id,
        t.instance_id,
        len(records),
        records[-1].seq,
        records[-1].event_key,
        list(records),  # a new list of the same records, as the view loader hands them out
        view_revision=covered,
        covered_to=covered,
        summary=summary,
        own_thread=t.thread_id,
    )


def _reply(
    snapshot: ThreadSnapshot, request: PrepareRequest, *, drop: bool, cache: ViewCache | None = None
) -> str:
    budget, counter = resolve_budget(request), counter_for("o200k_base")
    try:
        if cache is None:
            prepared = assemble_context(snapshot, request, budget, counter, allow_drop_history=drop)
        else:
            prepared = assemble_reusing(cache, snapshot, request, budget, counter, allow_drop_history=drop)
    except CtxError as exc:
        return f"{type(exc).__name__}: {exc}"
    if isinstance(prepared, OverBudgetView):
        return f"OverBudgetView: {prepared.error()}"
    return prepared.model_dump_json()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=_STEPS,
    budget=st.sampled_from([200_000, 4_000, 1_500]),
    compact_every=st.integers(0, 4),
    context_tools=st.booleans(),
    purpose=st.sampled_from(["action", "completion"]),
)
def test_contexts_the_view_cache_reuses_equal_contexts_assembled_anew_as_a_thread_grows_and_compacts(
    steps: list[tuple[str, int, bool]], budget: int, compact_every: int, context_tools: bool, purpose: str
) -> None:
    t = Thread()
    records = ledger_records(_events(t, steps))
    cache = ViewCache()
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id=t.instance_id,
        budget_tokens=budget,
        context_tools=context_tools,
        purpose=purpose,  # type: ignore[arg-type]
    )
    covered = 0
    drop = budget < 2_000
    for k in range(2, len(records) + 1):
        coverages = [covered]
        if compact_every and k % (compact_every + 3) == 0:
            # A summary swap on the same records: the covered prefix moves under a warm cache.
            covered = records[k // 2].seq
            coverages.append(covered)
        for c in coverages:
            fresh = _reply(_snapshot(t, records[:k], c), request, drop=drop)
            assert _reply(_snapshot(t, records[:k], c), request, drop=drop, cache=cache) == fresh
            assert _reply(_snapshot(t, records[:k], c), request, drop=drop, cache=cache) == fresh


def _one_call_thread(*, then: int = 0) -> tuple[Thread, list[LedgerRecord], PrepareRequest]:
    """A system prompt, a question, one call and its output, then ``then`` more user messages."""
    t = Thread()
    events = [
        t.system("s"),
        t.user("q"),
        t.assistant("a", calls=(("c1", "bash", {"cmd": "ls"}),)),
        t.outcome("c1", "x"),
    ]
    records = ledger_records(events + [t.user(f"and then step {n}") for n in range(then)])
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=9_000
    )
    return t, records, request


def test_view_cache_evicts_least_recently_used_entries_by_bytes() -> None:
    cache = ViewCache(max_bytes=100)
    cache.put("a", 1, 40)
    cache.put("b", 2, 40)
    assert cache.get("a") == 1  # a is now the most recently used
    assert cache.put("c", 3, 40) == ["b"]
    assert (cache.keys(), cache.bytes, cache.evictions) == (["a", "c"], 80, 1)
    assert cache.get("b") is None and (cache.hits, cache.misses) == (1, 1)


def test_view_cache_does_not_keep_an_entry_larger_than_its_bound() -> None:
    cache = ViewCache(max_bytes=100)
    cache.put("a", 1, 40)
    assert cache.put("huge", 2, 101) == []
    assert (cache.keys(), cache.bytes) == (["a"], 40)


pytestmark = pytest.mark.anyio


async def _record(store: MemoryStore, events: list[Any], start: int = 1) -> None:
    from services.app.recording import RecordingService
    from services.core.ledger import RecordingLimits

    class _Sink:
        async def publish(self, letter: object, msg_id: str) -> None:
            raise AssertionError(f"dead letter {msg_id}")

    await RecordingService(store, _Sink(), limits=RecordingLimits(), recorder_id="unit").record_batch(
        0, incoming(events, start)
    )


async def test_view_loader_never_serves_a_stale_cached_view_when_the_head_moves() -> None:
    store, t = MemoryStore(), Thread()
    await _record(store, [t.system("s"), t.user("q")])
    loader = ViewLoader()
    async with store.connection() as s:
        before = await loader.load(s, t.thread_id)
    await _record(store, [t.assistant("a", calls=(("c1", "bash", {"cmd": "ls"}),)), t.outcome("c1", "x")], 3)
    async with store.connection() as s:
        after = await loader.load(s, t.thread_id)
    assert [r.seq for r in before.records] == [1, 2]
    assert [r.seq for r in after.records] == [1, 2, 3, 4]


async def test_view_loader_under_a_tiny_bound_evicts_and_still_serves_every_view_whole() -> None:
    store = MemoryStore()
    threads = [Thread() for _ in range(3)]
    for n, t in enumerate(threads):
        await _record(store, [t.system("s"), t.user("q " * 200), t.assistant("a " * 200)], 1 + 3 * n)
    loader = ViewLoader(cache=ViewCache(max_bytes=6_000))
    for _ in range(2):
        for t in threads:
            async with store.connection() as s:
                view = await loader.load(s, t.thread_id)
            assert [r.seq for r in view.records] == [1, 2, 3]
    assert loader.cache.evictions > 0 and 0 < loader.cache.bytes <= 6_000


def test_view_cache_counts_are_exported_as_metrics() -> None:
    from prometheus_client import generate_latest

    from workers.metrics import FleetMetrics

    cache = ViewCache(max_bytes=100)
    cache.put("a", 1, 60)
    cache.get("a")
    cache.put("b", 2, 60)  # evicts a
    metrics = FleetMetrics()
    metrics.watch_view_cache(cache)
    metrics.watch_view_cache(cache)  # once per registry, whoever asks again
    text = generate_latest(metrics.registry).decode()
    for line in (
        "ctx_view_cache_hits_total 1.0",
        "ctx_view_cache_evictions_total 1.0",
        "ctx_view_cache_bytes 60.0",
        "ctx_view_cache_max_bytes 100.0",
        "ctx_view_cache_entries 1.0",
    ):
        assert line in text


def _assembled(
    cache: ViewCache, snapshot: ThreadSnapshot, request: PrepareRequest, **options: Any
) -> PreparedContext:
    budget, counter = resolve_budget(request), counter_for("o200k_base")
    reply = assemble_reusing(cache, snapshot, request, budget, counter, **options)
    assert isinstance(reply, PreparedContext)
    return reply


def test_a_prepare_of_an_unchanged_view_is_answered_with_the_context_assembled_last() -> None:
    t, records, request = _one_call_thread(then=3)
    cache = ViewCache()
    first = _assembled(cache, _snapshot(t, records, 0), request)
    # The same records in a new list, the request parsed anew from its bytes: what a prepare brings.
    parsed = PrepareRequest.model_validate_json(request.model_dump_json())
    again = _assembled(cache, _snapshot(t, records, 0), parsed)
    assert again is first
    assert again == _assembled(ViewCache(), _snapshot(t, records, 0), request)


def _with(request: PrepareRequest, **update: Any) -> PrepareRequest:
    """``request`` with ``update`` applied, validated as a request arriving would be."""
    return PrepareRequest.model_validate({**request.model_dump(), **update})


@pytest.mark.parametrize(
    "change",
    ["budget", "format", "purpose", "context_tools", "summary", "record_appended", "head_revision", "thread"],
)
def test_a_prepare_whose_view_or_inputs_changed_is_assembled_again(change: str) -> None:
    t, records, request = _one_call_thread(then=3)
    cache = ViewCache()
    first = _assembled(cache, _snapshot(t, records[:-1], 0), request)
    snapshot = _snapshot(t, records[:-1], 0)
    if change == "budget":
        request = _with(request, budget_tokens=8_000)
    elif change == "format":
        request = _with(request, format="openai.responses")
    elif change == "purpose":
        request = _with(request, purpose="completion")
    elif change == "context_tools":
        request = _with(request, context_tools=True)
    elif change == "summary":  # a new view revision
        snapshot = _snapshot(t, records[:-1], records[2].seq)
    elif change == "record_appended":
        snapshot = _snapshot(t, records, 0)
    elif change == "head_revision":
        snapshot = replace(snapshot, revision=snapshot.revision + 1)
    elif change == "thread":
        snapshot = replace(snapshot, own_thread="another")
    again = _assembled(cache, snapshot, request)
    assert again is not first
    assert again == _assembled(ViewCache(), snapshot, request)


def test_the_view_cache_keeps_a_few_contexts_of_one_view_and_forgets_them_when_the_view_changes() -> None:
    t, records, request = _one_call_thread(then=3)
    cache = ViewCache()
    requests = [request.model_copy(update={"budget_tokens": 9_000 + n}) for n in range(5)]
    first = [_assembled(cache, _snapshot(t, records[:-1], 0), r) for r in requests]
    # Four are kept: the first of five was let go.
    newest_first = list(zip(requests, first, strict=True))[::-1]
    assert [_assembled(cache, _snapshot(t, records[:-1], 0), r) is p for r, p in newest_first] == [
        *[True] * 4,
        False,
    ]
    kept = cache.bytes
    grown = _assembled(cache, _snapshot(t, records, 0), requests[-1])
    assert grown is not first[-1]
    # A context of the grown view: the ones of the view before are gone, and so are their bytes.
    assert cache.bytes < kept


def test_a_prepare_that_waited_on_a_compaction_or_dropped_history_is_never_taken_from_the_cache() -> None:
    t, records, request = _one_call_thread(then=3)
    cache = ViewCache()
    first = _assembled(cache, _snapshot(t, records, 0), request)
    waited = _assembled(cache, _snapshot(t, records, 0), request, compaction_wait_ms=250)
    dropping = _assembled(cache, _snapshot(t, records, 0), request, allow_drop_history=True)
    assert waited is not first and waited.compaction_wait_ms == 250
    assert dropping is not first
    assert _assembled(cache, _snapshot(t, records, 0), request) is first


async def test_the_budgeter_measures_a_view_from_the_blocks_its_last_prepare_built_as_it_would_without() -> (
    None
):
    store, t = MemoryStore(), Thread()
    await _record(
        store, [t.system("s"), t.user("q"), t.assistant("a", calls=(("c1", "bash", {"cmd": "ls"}),))]
    )
    loader = ViewLoader()
    request = PrepareRequest(
        session_id=t.session_id, run_id=t.run_id, instance_id=t.instance_id, budget_tokens=9_000
    )
    async with store.connection() as s:
        view = await loader.load(s, t.thread_id)
    assert last_blocks(loader.cache, t.thread_id, summarized=False) is None
    _assembled(loader.cache, view.snapshot(), request)
    await _record(store, [t.outcome("c1", "x" * 400), t.assistant("done")], 4)
    async with store.connection() as s:
        view = await loader.load(s, t.thread_id)
    previous = last_blocks(loader.cache, t.thread_id, summarized=False)
    assert previous is not None and [r.seq for r in previous.records] == [1, 2, 3]
    budget, reserved = view.compaction_budget, view.state.prepare_reserved
    extended = measure(view, view.records, budget=budget, reserved=reserved, previous=previous)
    assert extended == measure(view, view.records, budget=budget, reserved=reserved)
