"""``ctxfleet eval --ladder``: replay a trace through the fleet's services in this process, score the rungs.

No broker and no database: the trace's events go through the recorder's service
(``RecordingService``, state and tool effects included) into the in-memory store, the budgeter's
service evaluates the policy after every batch and the compactor's service runs each job it
enqueues at once — the fleet's compaction as it is, only without waiting on a queue. A prepare the
fleet would answer by waiting for an urgent compaction gets that compaction first, exactly once per
state, as ``PrepareService`` asks for it. The indexer's service indexes every batch, so rung G
searches the store's index for the current step and reads the archived hits back as evidence, as a
runtime would (``services.core.evaluation.retrieval``). Then every rung assembles the same point
(``services.core.evaluation.ladder``) and the pure scorer counts it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import JsonValue

from contracts import (
    AssistantMessageEvent,
    CompactionJob,
    ContextPolicy,
    DeadLetter,
    Event,
    PrepareRequest,
    RunStatusEvent,
    SearchHit,
    SearchRequest,
    ToolCatalog,
    ToolSchema,
)
from contracts.subjects import DEFAULT_TENANT

from services.app.budgeting import BudgetService
from services.app.catalogs import validate_catalog
from services.app.compacting import CompactionService
from services.app.indexing import index_thread
from services.app.reading import verified_blob
from services.app.recording import RecordingService
from services.app.views import ViewLoader
from services.core.assemble import Evidence, ThreadSnapshot
from services.core.budget import resolve_budget
from services.core.evaluation import ContextCounter
from services.core.evaluation.ladder import LadderPoint, Rung, RungName, core_rungs
from services.core.evaluation.retrieval import archived_hits, step_queries
from services.core.evaluation.rollover_rung import RolloverRung
from services.core.evaluation.ladder_scoring import LadderTraceScore, RungScore, score_point
from services.core.ledger import Incoming, RecordingLimits
from services.core.tokens import counter_for
from services.core.trace import TraceLine
from services.edge.replay import ReplayOptions, trace_events
from contracts.exceptions import InvalidRequest
from services.store.memory import MemoryStore

__all__ = ["LadderReport", "LadderTrace", "RungFactory", "ladder_rungs", "ladder_trace", "run_ladder"]

RungFactory = Callable[[], list[Rung]]


@dataclass(frozen=True, slots=True)
class LadderTrace:
    """A trace to run the ladder on, and the release catalog its tools follow (if it has state)."""

    name: str
    lines: tuple[TraceLine, ...]
    catalog: ToolCatalog | None = None


@dataclass(slots=True)
class LadderReport:
    """Scores per trace × budget, and the aggregate per budget."""

    budgets: tuple[int, ...]
    rungs: tuple[str, ...]
    traces: list[LadderTraceScore] = field(default_factory=list)
    system_prompt_tokens: int | None = None

    def aggregate(self) -> dict[int, dict[str, RungScore]]:
        """Per budget, each rung's figures summed over the traces."""
        out = {b: {r: RungScore.empty(r) for r in self.rungs} for b in self.budgets}
        for score in self.traces:
            for name, rung in score.rungs.items():
                out[score.budget][name].merge(rung)
        return out

    def as_json(self) -> dict[str, JsonValue]:
        """Everything ``--json`` writes for the ladder."""
        return {
            "budgets": list(self.budgets),
            "rungs": list(self.rungs),
            "system_prompt_tokens": self.system_prompt_tokens,
            "aggregate": {
                str(b): {name: s.as_json() for name, s in rungs.items()}
                for b, rungs in self.aggregate().items()
            },
            "traces": [t.as_json() for t in self.traces],
        }


class _Letters:
    """Dead letters of the replay: a trace the recorder refuses is reported, not scored in part."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []

    async def publish(self, letter: DeadLetter, msg_id: str) -> None:
        self.letters.append(letter)


class _Jobs:
    def __init__(self) -> None:
        self.jobs: list[CompactionJob] = []

    async def publish(self, job: CompactionJob) -> None:
        self.jobs.append(job)


async def ladder_trace(
    trace: LadderTrace,
    budget: int,
    *,
    rungs: RungFactory | None = None,
    session_id: str = "ladder",
) -> LadderTraceScore:
    """Replay ``trace`` at ``budget`` once and score every rung at every prepare."""
    store, jobs, letters = MemoryStore(), _Jobs(), _Letters()
    policy = ContextPolicy(name=f"ladder-{budget}", model_profile=None, budget_tokens=budget)
    await store.register_policy(DEFAULT_TENANT, policy)
    if trace.catalog is not None:
        validate_catalog(trace.catalog)
        await store.register_catalog(DEFAULT_TENANT, trace.catalog)
    options = ReplayOptions(
        session_id=session_id, model_profile=None, budget_tokens=budget, policy=policy.name
    )
    events = trace_events(trace.lines, options)
    if trace.catalog is not None and events:
        events[0] = events[0].model_copy(update={"agent_release": trace.catalog.release})
    loader = ViewLoader()
    recorder = RecordingService(store, letters, limits=RecordingLimits(), recorder_id="ladder")
    budgeter, compactor = BudgetService(store, loader, jobs), CompactionService(store, loader)
    tools = tuple(ToolSchema(name=t.name) for t in trace.catalog.tools) if trace.catalog else ()
    counter, eval_counter = counter_for("o200k_base"), ContextCounter(counter_for("o200k_base"))
    built = rungs() if rungs is not None else ladder_rungs(trace.catalog)
    # Search only for a ladder with a rung that shows the archive (a spy may wrap it: ask its name).
    retrieving = any(r.name == RungName.RETRIEVAL.value for r in built)
    # Events and the trace lines they came from: the replayer adds run-closing events of its own.
    line_of = _line_indexes(trace.lines, events)
    points = _prepare_points(events)
    score = LadderTraceScore.start(trace.name, budget, len(points), [r.name for r in built])
    recorded, stream_seq = 0, 0
    for index in points + [len(events)]:
        batch = events[recorded:index]
        if batch:
            incoming = [
                Incoming(
                    subject=f"ctx.p.0.{DEFAULT_TENANT}.{e.session_id}.{e.thread_id}",
                    data=e.model_dump_json().encode(),
                    stream_seq=stream_seq + n + 1,
                )
                for n, e in enumerate(batch)
            ]
            stream_seq += len(batch)
            result = await recorder.record_batch(0, incoming)
            if result.rejections:
                first = result.rejections[0]
                raise InvalidRequest(
                    f"{trace.name}: the recorder refused {first.event_key} ({first.code.value}): "
                    "the ladder scores whole traces only"
                )
            # What the budgeter and the compactors do after a batch: evaluate, run every job it enqueued.
            for thread_id in sorted(result.heads):
                await budgeter.evaluate(thread_id)
                while jobs.jobs:
                    await compactor.run(jobs.jobs.pop(0))
                await index_thread(store, thread_id)
            recorded = index
        if index == len(events):
            break
        event = events[index]
        request = PrepareRequest(
            session_id=event.session_id,
            run_id=event.run_id,
            instance_id=event.instance_id,
            budget_tokens=budget,
            tools=tools,
        )
        # The view as the budgeter's compactions left it (the rungs fit the rest by dropping history).
        async with store.connection() as s:
            view = await loader.load(s, event.thread_id)
        snapshot = view.snapshot()
        archive = await _archive(store, snapshot) if retrieving else ()
        point = LadderPoint(
            snapshot, request, resolve_budget(request), counter, state=view.facts, archive=archive
        )
        contexts = {r.name: r.context(point) for r in built}
        score_point(score, trace.lines[: line_of[index]], trace.catalog, contexts, eval_counter)
    return score


async def run_ladder(
    traces: Sequence[LadderTrace],
    budgets: Sequence[int],
    *,
    rungs: RungFactory | None = None,
    on_done: Callable[[LadderTraceScore], None] | None = None,
) -> LadderReport:
    names = tuple(r.name for r in (rungs() if rungs is not None else ladder_rungs(None)))
    report = LadderReport(tuple(budgets), names)
    for t_index, trace in enumerate(traces):
        for budget in budgets:
            score = await ladder_trace(trace, budget, rungs=rungs, session_id=f"ladder-t{t_index}-b{budget}")
            report.traces.append(score)
            if on_done is not None:
                on_done(score)
    return report


def ladder_rungs(catalog: ToolCatalog | None) -> list[Rung]:
    """Every rung the fleet runs from a trace: A–G of the core, then the rollover strategy."""
    return [*core_rungs(), RolloverRung(rules=catalog.paths if catalog else ())]


async def _archive(store: MemoryStore, snapshot: ThreadSnapshot) -> tuple[Evidence, ...]:
    """Rung G's evidence: the store's search for the step's identifiers, archived hits read back."""
    hits: list[SearchHit] = []
    for query in step_queries(snapshot.records):
        found = await store.search(
            DEFAULT_TENANT, SearchRequest(session_id=snapshot.session_id, query=query, limit=10)
        )
        hits.extend(found or ())
    chosen = archived_hits(hits, snapshot)
    async with store.connection() as s:
        rows = await s.select_evidence(snapshot.session_id, [(h.thread_id, h.seq) for h in chosen])
    out: list[Evidence] = []
    for hit in chosen:
        row = rows[(hit.thread_id, hit.seq)]
        text = row.text or ""
        if row.blob is not None and row.blob_sha256 is not None:
            text = verified_blob(row.blob, row.blob_sha256).decode("utf-8", "replace")
        # The hit's chunk only, as a runtime's evidence ref names its lines.
        lines = text.splitlines(keepends=True)
        text = "".join(lines[hit.start_line - 1 : hit.end_line]) or text
        out.append(
            Evidence(
                hit.thread_id, hit.seq, row.event_key, row.kind, row.content_sha256, row.record_hash, text
            )
        )
    return tuple(out)


def _prepare_points(events: Sequence[Event]) -> list[int]:
    """Before each assistant message that is not its run's first event, as the replayer prepares."""
    started: set[str] = set()
    points = []
    for i, event in enumerate(events):
        if isinstance(event, AssistantMessageEvent) and event.run_id in started:
            points.append(i)
        started.add(event.run_id)
    return points


def _line_indexes(lines: Sequence[TraceLine], events: Sequence[Event]) -> list[int]:
    """For each event index, how many trace lines come before it (run-closing events have no line)."""
    out: list[int] = []
    n = 0
    for event in events:
        out.append(n)
        if not isinstance(event, RunStatusEvent):
            n += 1
    out.append(n)
    return out
