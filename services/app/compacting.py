"""The compactor's service: run one job, commit a verified summary revision or leave the view as it was.

Every outcome but ``committed`` leaves the counter baseline where it was: a failed
summary, an empty or invalid one, no real reduction, or a lost race. Source records are never
touched; a new summary chains to its parent and covers only records its parent did not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import time
from dataclasses import dataclass, replace
from functools import partial

from contracts import CompactionJob, CompactionPolicy, SummaryHook

from services.core.turns import counts_as_turn
from services.core.compaction.merge import merge_summaries
from services.core.compaction.region import Region, next_region, rolled_up
from services.core.compaction.model import (
    Segment,
    SegmentTooLong,
    SourcedText,
    StructuredSummary,
    Summarizer,
    SummarizerFailed,
)
from services.core.compaction.policy import (
    Throttle,
    ViewMeasure,
    ratio_threshold,
    throttle_from,
    trigger_hits,
)
from services.app.budgeting import measure as measure_of
from services.core.assemble import SummaryView
from services.core.compaction.select import choose_cover, split_segments, summary_cap
from services.core.compaction.structured import StructuredSummarizer
from services.core.compaction.validate import CandidateInvalid, validate_candidate
from services.app.compact_hooks import after_compaction, before_compaction
from services.app.hook_registry import HookRegistry
from contracts.exceptions import CtxError, RevisionConflict
from services.core.groups import DraftBlock, run_task_seq
from services.core.records import LedgerRecord
from services.core.render import MESSAGE_OVERHEAD
from services.store.ports import CompactionStore
from services.store.views import NewSummary
from services.core.tokens import counter_for
from services.app.views import ThreadView, ViewLoader, count_totals
from services.app.tracing import Tracing, record_compaction, record_error

__all__ = [
    "CompactionService",
    "JobOutcome",
    "SUMMARY_INSTRUCTION",
    "SummarizerFactory",
]

SUMMARY_INSTRUCTION = "Summarize the covered records so the agent can continue the task without them."


@dataclass(frozen=True)
class JobOutcome:
    """What a job did: ``committed``, ``deferred``, ``failed``, ``dropped`` (lost a race) or ``stale``."""

    status: str
    stage: str = ""
    detail: str = ""
    tokens_before: int = 0
    tokens_after: int = 0
    calls: int = 0
    view_revision: int = 0
    target_reached: bool = False
    summarizer: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    summarizer_seconds: float = 0.0
    # Committed: the ledger range the new summary covers.
    covered_from: int = 0
    covered_to: int = 0


SummarizerFactory = Callable[[LedgerRecord | None], Summarizer]


def _default_summarizer(current_request: LedgerRecord | None) -> Summarizer:
    return StructuredSummarizer(current_request)


class CompactionService:
    """Runs compaction jobs against the ledger and the view state."""

    def __init__(
        self,
        store: CompactionStore,
        loader: ViewLoader,
        summarizer: SummarizerFactory = _default_summarizer,
        hooks: HookRegistry | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._hooks = hooks
        self._tracing = tracing or Tracing.off()
        self._store = store
        self._loader = loader
        self._summarizer = summarizer

    async def run(self, job: CompactionJob) -> JobOutcome:
        """Run one job to a final outcome (the job may be acked whatever it returns), in a span of its own."""
        with self._tracing.compaction(job) as span:
            try:
                outcome = await self._run(job)
            except CtxError as exc:
                if span.is_recording():
                    record_error(span, exc.code.value, exc.message)
                raise
            record_compaction(span, outcome)
            return outcome

    async def _run(self, job: CompactionJob) -> JobOutcome:
        async with self._store.connection() as store:
            view = await self._loader.load(store, job.thread_id)
            if view.state.view_revision != job.view_revision:
                await store.clear_pending(job.thread_id, job.job_id)
                return JobOutcome("stale", "load", f"view moved to revision {view.state.view_revision}")
        # No connection is held while the summarizer runs (a network call that may take seconds): the
        # commit compare-and-sets the view revision, so nothing read above can go stale unnoticed.
        outcome, summary = await self._build(view, job)
        async with self._store.connection() as store:
            if summary is None:
                failed = outcome.status == "failed"
                await store.record_attempt(
                    job.thread_id,
                    throttle=_throttle_of(view, job, outcome),
                    reason=f"{outcome.stage}: {outcome.detail}"[:500],
                    failed=failed,
                    fingerprint=job.job_id,
                )
                return outcome
            try:
                await store.commit_summary(job.view_revision, summary)
            except RevisionConflict as exc:
                # Another compactor covered a prefix first: ours would double-cover. Drop it.
                await store.clear_pending(job.thread_id, job.job_id)
                return JobOutcome(
                    "dropped",
                    "commit",
                    exc.message,
                    outcome.tokens_before,
                    outcome.tokens_after,
                    outcome.calls,
                )
        return outcome

    async def _build(self, view: ThreadView, job: CompactionJob) -> tuple[JobOutcome, NewSummary | None]:
        policy = view.policy.compaction
        encoding = view.encoding
        records = [r for r in view.records if r.seq <= job.watermark]
        parent = view.state.summary
        summary_tokens = parent.tokens(encoding) if parent else 0
        # Over the hard budget the recent groups may go too — but never the newest complete one:
        # the model must see the result of its last action.
        keep = (
            policy
            if not job.urgent
            else policy.model_copy(update={"keep_recent_groups": min(1, policy.keep_recent_groups) or 1})
        )
        # The tool schemas the asking prepare sends count against the same budget as the view.
        measure, eligible, sizes = measure_of(
            view, records, keep, budget=job.input_budget, reserved=job.reserved_tokens
        )
        cap = summary_cap(policy, job.input_budget, measure.required)
        # A compaction that pays for the cache it invalidates covers all it can: the smaller the
        # context it leaves, the longer until the next one.
        ratio_hit = job.urgent or ("context_ratio" in job.reasons and "cache" not in job.reasons)
        choice = choose_cover(
            eligible,
            measure,
            policy,
            sizes,
            ratio_hit=ratio_hit,
            summary_allowance=cap,
            current_summary=summary_tokens + (MESSAGE_OVERHEAD if parent else 0),
        )
        counter = counter_for(encoding)
        new_revision = view.state.view_revision + 1
        if choice is None:
            if parent is not None and summary_tokens > cap:
                return self._rolled_up(view, job, measure, parent.body, cap, new_revision)
            return JobOutcome("deferred", "select", "nothing_compressible", measure.estimated), None
        chosen = list(choice.blocks)
        # The hooks that narrowed the range or patched the summary, recorded with it.
        shaped_by: tuple[SummaryHook, ...] = ()
        if self._hooks is not None:
            try:
                scope = await before_compaction(
                    self._hooks, view.scope.tenant, view.head.session_id, job.thread_id, chosen, cap
                )
            except CtxError as exc:
                return JobOutcome(
                    "failed", "hook", f"{exc.code.value}: {exc.message}", measure.estimated
                ), None
            if not scope.blocks:
                return JobOutcome("deferred", "hook", "narrowed_to_nothing", measure.estimated), None
            chosen, cap, shaped_by = list(scope.blocks), scope.target_tokens, scope.hooks
        segments = split_segments(chosen, max(1, job.input_budget // 2), counter)[
            : policy.max_compaction_calls
        ]
        covered_blocks = [b for seg in segments for b in seg]
        current_request = next((r for r in reversed(records) if counts_as_turn(r.body)), None)
        summarizer = self._summarizer(current_request)
        cost = _Cost()
        alone: list[StructuredSummary] = []
        try:
            merged, calls = await _summarize(
                summarizer,
                segments,
                parent.body if parent else None,
                policy.max_compaction_calls,
                cost,
                own=alone,
            )
        except SummarizerFailed as exc:
            return replace(
                cost.outcome(summarizer.name),
                status="failed",
                stage=exc.stage,
                detail=str(exc),
                tokens_before=measure.estimated,
            ), None
        own = alone[0]
        if current_request is not None:
            # The task comes from its own record, whatever the summarizer made of it.
            request = SourcedText(
                text=current_request.text[:1200] or "(empty)", sources=(current_request.seq,)
            )
            merged = merged.model_copy(update={"current_request": request})
            own = own.model_copy(update={"current_request": request})
        covered_records = sorted((r for b in covered_blocks for r in b.records), key=lambda r: r.seq)

        def validate(candidate: StructuredSummary) -> None:
            validate_candidate(
                candidate,
                parent=parent.body if parent else None,
                covered=covered_records,
                existing_seqs={r.seq for r in records},
                has_request=current_request is not None,
            )

        try:
            validate(merged)
            if self._hooks is not None:
                merged, patched_by = await after_compaction(
                    self._hooks, view.scope.tenant, view.head.session_id, job.thread_id, merged, validate
                )
                shaped_by = (*shaped_by, *patched_by)
        except CandidateInvalid as exc:
            return replace(
                cost.outcome(summarizer.name),
                status="failed",
                stage="validate",
                detail=str(exc),
                tokens_before=measure.estimated,
                calls=calls,
            ), None
        # Validated whole. The new part is appended after the summary the context shows, which stays
        # as it is for the prompt cache, while the region fits its share; past it, one roll-up
        # rewrites the region to its share: a long thread's summary converges instead of growing with
        # every compaction (what must survive is kept verbatim by the roll-up). A summary a hook
        # patched is rewritten whole: the part alone would not show the patch.
        pinned = _pinned(records, job.thread_id)
        covered_to = max(r.seq for r in covered_records)
        fit = partial(next_region, max_tokens=cap, count=counter.count, revision=new_revision, pinned=pinned)
        appendable = parent is not None and not any(h.point == "context.compact.after" for h in shaped_by)
        region = fit(
            merged,
            previous=(parent.text, view.state.view_revision, parent.body) if parent and appendable else None,
            own=own,
        )
        after, post = self._measured(view, records, keep, job, region, covered_to)
        if after >= measure.estimated and region.appended:
            # The appended region is larger than a rolled-up one: the roll-up may still reduce.
            region = fit(merged)
            after, post = self._measured(view, records, keep, job, region, covered_to)
        fitted, text = region.body, region.text
        o200k, cl100k = counter_for("o200k_base").count(text), counter_for("cl100k_base").count(text)
        written_tokens = o200k if encoding == "o200k_base" else cl100k
        if after >= measure.estimated:
            covered_tokens = sum(sizes[b.block_id] for b in covered_blocks)
            replaced = covered_tokens + summary_tokens + (MESSAGE_OVERHEAD if parent else 0)
            return replace(
                cost.outcome(summarizer.name),
                status="failed",
                stage="reduction",
                detail=_no_reduction(
                    measure,
                    after,
                    len(covered_blocks),
                    replaced,
                    written_tokens + MESSAGE_OVERHEAD,
                    cap,
                    chained=parent is not None,
                ),
                tokens_before=measure.estimated,
                tokens_after=after,
                calls=calls,
            ), None
        outcome = replace(cost.outcome(summarizer.name), calls=calls)
        return self._commit_plan(
            view,
            job,
            measure,
            fitted,
            text,
            (o200k, cl100k),
            covered_to,
            after,
            post.compressible,
            outcome,
            records,
            hooks=shaped_by,
        )

    def _measured(
        self,
        view: ThreadView,
        records: list[LedgerRecord],
        keep: CompactionPolicy,
        job: CompactionJob,
        region: Region,
        covered_to: int,
    ) -> tuple[int, ViewMeasure]:
        """The view's estimate with ``region`` committed. Measured anew, not by subtraction: an output
        shown as a reference to one the summary now covers is shown whole again."""
        counts = counter_for("o200k_base").count(region.text), counter_for("cl100k_base").count(region.text)
        written = SummaryView(
            summary_id="",
            view_revision=view.state.view_revision + 1,
            covered_from=region.body.covered_from,
            covered_to=covered_to,
            text=region.text,
            tokens_o200k=counts[0],
            tokens_cl100k=counts[1],
            sources=(),
        )
        post, _, _ = measure_of(
            view,
            records,
            keep,
            budget=job.input_budget,
            reserved=job.reserved_tokens,
            snapshot=replace(view.snapshot(), summary=written, covered_to=covered_to),
        )
        return post.estimated, post

    def _rolled_up(
        self,
        view: ThreadView,
        job: CompactionJob,
        measure: ViewMeasure,
        body: StructuredSummary,
        cap: int,
        new_revision: int,
    ) -> tuple[JobOutcome, NewSummary | None]:
        """Nothing new to cover, but the summary is over its share of this budget: roll it up alone."""
        counter = counter_for(view.encoding)
        pinned = _pinned(view.records, job.thread_id)
        region = rolled_up(body, max_tokens=cap, count=counter.count, revision=new_revision, pinned=pinned)
        fitted, text = region.body, region.text
        o200k, cl100k = counter_for("o200k_base").count(text), counter_for("cl100k_base").count(text)
        parent = view.state.summary
        assert parent is not None
        before = parent.tokens(view.encoding)
        after = measure.estimated - before + (o200k if view.encoding == "o200k_base" else cl100k)
        if after >= measure.estimated:
            return JobOutcome("deferred", "select", "nothing_compressible", measure.estimated), None
        records = [r for r in view.records if r.seq <= job.watermark]
        outcome = JobOutcome("failed", summarizer="rollup")
        return self._commit_plan(
            view,
            job,
            measure,
            fitted,
            text,
            (o200k, cl100k),
            view.state.covered_to,
            after,
            measure.compressible,
            outcome,
            records,
        )

    def _commit_plan(
        self,
        view: ThreadView,
        job: CompactionJob,
        measure: ViewMeasure,
        body: StructuredSummary,
        text: str,
        tokens: tuple[int, int],
        covered_to: int,
        after: int,
        compressible: int,
        outcome: JobOutcome,
        records: list[LedgerRecord],
        *,
        hooks: tuple[SummaryHook, ...] = (),
    ) -> tuple[JobOutcome, NewSummary]:
        policy = view.policy.compaction
        parent = view.state.summary
        totals = count_totals(records)
        post = ViewMeasure(after, measure.required, compressible, measure.budget)
        still = trigger_hits(post, totals, totals, policy)
        target = after <= ratio_threshold(policy.target_context_ratio, job.input_budget)
        new_revision = view.state.view_revision + 1
        outcome = replace(
            outcome,
            status="committed",
            stage="commit",
            tokens_before=measure.estimated,
            tokens_after=after,
            view_revision=new_revision,
            target_reached=target,
            covered_from=body.covered_from,
            covered_to=covered_to,
        )
        return outcome, NewSummary(
            thread_id=job.thread_id,
            parent_summary_id=parent.summary_id if parent else None,
            body=body,
            text=text,
            tokens_o200k=tokens[0],
            tokens_cl100k=tokens[1],
            covered_to=covered_to,
            source_watermark=job.watermark,
            policy_name=view.policy_name,
            policy_revision=view.policy_revision,
            summarizer=outcome.summarizer,
            calls=outcome.calls,
            trigger_reasons=job.reasons,
            tokens_before=measure.estimated,
            tokens_after=after,
            target_reached=target,
            job_id=job.job_id,
            baseline=totals,
            throttle=throttle_from("committed_still_over", post, totals, still) if still else None,
            hooks=hooks,
        )


@dataclass
class _Cost:
    """What the summarizer calls of one job cost (tokens when the provider reports usage)."""

    input_tokens: int = 0
    output_tokens: int = 0
    seconds: float = 0.0

    def add(self, summarizer: Summarizer, seconds: float) -> None:
        self.seconds += seconds
        usage = getattr(summarizer, "last_usage", None)
        if isinstance(usage, dict):
            self.input_tokens += int(usage.get("input_tokens", 0))
            self.output_tokens += int(usage.get("output_tokens", 0))

    def outcome(self, name: str) -> JobOutcome:
        return JobOutcome(
            "failed",
            summarizer=name,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            summarizer_seconds=self.seconds,
        )


async def _summarize(
    summarizer: Summarizer,
    segments: Sequence[Sequence[DraftBlock]],
    parent: StructuredSummary | None,
    max_calls: int,
    cost: _Cost | None = None,
    own: list[StructuredSummary] | None = None,
) -> tuple[StructuredSummary, int]:
    """Summarize segments in order, halving any a provider rejects as too long; never skip one.

    The summary of ``parent`` and the segments, and the calls; ``own`` (when given) ends as the
    summary of the segments alone (the part a compaction may append to the committed summary)."""
    queue: list[Sequence[DraftBlock]] = list(segments)
    merged = parent
    job_from = min((r.seq for seg in segments for b in seg for r in b.records), default=None)
    calls = 0
    while queue:
        segment = queue.pop(0)
        if calls >= max_calls:
            raise SummarizerFailed("max_calls", f"needs more than {max_calls} summarizer calls")
        calls += 1
        records = sorted((r for b in segment for r in b.records), key=lambda r: r.seq)
        started = time.perf_counter()
        try:
            part = await summarizer.summarize(
                Segment(records=records, parent=merged, instruction=SUMMARY_INSTRUCTION)
            )
        except SegmentTooLong:
            if cost is not None:
                cost.add(summarizer, time.perf_counter() - started)
            if len(segment) == 1:
                raise SummarizerFailed(
                    "too_long", f"one tool group ({segment[0].block_id}) is too long to summarize"
                ) from None
            half = len(segment) // 2
            queue[:0] = [segment[:half], segment[half:]]
            continue
        if cost is not None:
            cost.add(summarizer, time.perf_counter() - started)
        merged = merge_summaries(merged, part, keep_failures_from=job_from)
        if own is not None:
            own[:] = [merge_summaries(own[0] if own else None, part, keep_failures_from=job_from)]
    assert merged is not None
    return merged, calls


def _no_reduction(
    measure: ViewMeasure, after: int, blocks: int, replaced: int, summary: int, cap: int, *, chained: bool
) -> str:
    """Why a summary that was written is not committed, and what a person can do about it.

    ``replaced``: the tokens of the ``blocks`` it would cover and of the summary before it, if any
    (``chained``); ``summary``: its own, framing included.
    """
    back = after - (measure.estimated - replaced + summary)
    before = " and the summary before it" if chained else ""
    why = [f"the summary ({summary} tokens) would replace {blocks} block(s){before} ({replaced} tokens)"]
    if back > 0:
        # A later output identical to one covered is no longer a reference: the view shows it whole.
        why.append(f"{back} tokens of repeated tool outputs it leaves in view would be shown whole again")
    what = f"no real reduction ({measure.estimated} → {after} tokens): {'; '.join(why)}"
    if measure.required >= measure.budget:
        return (
            f"{what}. The required content alone ({measure.required} tokens: instructions, the run's "
            f"task and current request, state, tool schemas) exceeds the {measure.budget}-token budget, "
            "so no summary can make it fit: raise the policy's budget_tokens or its model profile's "
            "window, or shorten the instructions"
        )
    return (
        f"{what}. The view keeps its history (a summary may take up to {cap} tokens at this budget) "
        "and the budgeter tries again once the thread has grown; to let more go now, lower the "
        "policy's keep_recent_groups"
    )


def _pinned(records: Sequence[LedgerRecord], thread_id: str) -> tuple[int, ...]:
    """Records every context shows verbatim beside the summary: the run's task."""
    task = run_task_seq(records, thread_id)
    return (task,) if task is not None else ()


def _throttle_of(view: ThreadView, job: CompactionJob, outcome: JobOutcome) -> Throttle:
    """After an attempt that did not commit, wait for growth before the next one."""
    records = [r for r in view.records if r.seq <= job.watermark]
    # Measured as the budgeter measures, or its retry check would see a change that is not one.
    measure, _, _ = measure_of(view, records, budget=job.input_budget, reserved=job.reserved_tokens)
    totals = count_totals(records)
    hits = trigger_hits(measure, totals, view.baseline, view.policy.compaction)
    return throttle_from(f"{outcome.status}:{outcome.stage}", measure, totals, hits)
