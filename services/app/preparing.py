"""The assembler's service: answer prepares and inspections from the store.

What a prepare is answered from is stated once, in ``services/app/freshness.py``: a view loaded
from the ledger, after the event a request names (``after_event_key``) is in it. The hot path never
calls a summarizer: when a view is over budget even after the deterministic reductions, it asks for
the thread's compaction job and waits for its commit up to ``compaction_wait_ms`` (less when the job
ends without one), then serves the context without the oldest history still awaiting compaction,
each omission named — never an over-budget context, and ``ContextBudgetExceeded`` only when required
content alone does not fit.
"""

from __future__ import annotations

import logging
import time
import asyncio
from contextlib import ExitStack
from dataclasses import dataclass, replace
from typing import assert_never

from contracts import (
    CompactionJob,
    InspectRequest,
    PreparedContext,
    PrepareRequest,
    ThreadInspection,
    thread_id_of,
)
from contracts.subjects import DEFAULT_TENANT

from contracts.hooks import HookSet
from contracts.prepare import ProviderOverflow
from contracts.task_budgets import TaskBudgetReport
from contracts.windows import WindowStrategy

from services.core.assemble import Evidence, SummaryView, ThreadSnapshot
from contracts.exceptions import (
    ContentNotFound,
    ContextBudgetExceeded,
    FleetUnavailable,
    InvalidRequest,
    ProviderContextExceeded,
    ThreadNotFound,
)
from services.core.prepare_step import (
    Assemble,
    AwaitCompaction,
    CompactionWait,
    Done,
    Learn,
    PrepareProgress,
    Recount,
    Refuse,
    RequestCompaction,
    RollOver,
    next_step,
)
from services.core.budget import BUILTIN_PROFILES, BudgetSpec, calibrated, resolve_budget
from services.core.calibration import (
    Calibration,
    learn_from_usage,
    raise_on_overflow,
    request_tokens_before,
)
from services.core.hashing import verify_chain
from services.core.history_depth import depths_of
from services.killpoints import kill_point
from services.app.final_checks import GatewayService
from services.app.hook_registry import HookRegistry
from services.app.prepare_hooks import PrepareHooks, after_prepare, before_prepare
from services.app.freshness import RECHECK_S, view_after
from services.app.notices import NO_PAUSE, NoticeBoard, Pause, wait_for_notice
from services.app.reading import verified_blob
from services.app.scheduling import JobQueue, request_job
from services.core.state import StateView, rebuild_state, state_hash
from services.core.task_budget import ensure_within, ledger_of, task_budget_report
from services.store.ports import PrepareStore
from services.core.tokens import ENCODINGS, EncodingName, TokenCounter, counter_for
from services.app.view_cache import ViewCache, assemble_reusing, first_depth_reusing
from services.app.views import ThreadView, ViewLoader
from services.app.windows import WindowKeeper
from services.app.step_timing import PrepareStages, ignore_stage
from services.core.windows.next_window import window_of

__all__ = ["PrepareService"]

log = logging.getLogger("ctxfleet.assembler")

# A queue that refuses jobs (a full JetStream store) refuses every prepare's: one warning per interval.
_UNQUEUED_WARN_EVERY_S = 30.0


class _NotQueued:
    """The queue did not take the job (JetStream full or unreachable): no compaction is coming."""


_NOT_QUEUED = _NotQueued()


@dataclass(frozen=True, slots=True)
class _CompactionWait:
    """A prepare's wait for compactions: when it began, its deadline, and its wake-ups of the thread."""

    started: float
    deadline: float
    woken: asyncio.Event


def _carried(view: ThreadView, snapshot: ThreadSnapshot) -> ThreadSnapshot:
    """``view``'s snapshot, with what the request brought to ``snapshot`` (evidence, validated
    additions, hook changes)."""
    fresh = view.snapshot()
    if not (snapshot.evidence or snapshot.additions or snapshot.hooked):
        return fresh
    return replace(fresh, evidence=snapshot.evidence, additions=snapshot.additions, hooked=snapshot.hooked)


def _depths(
    progress: PrepareProgress,
    view: ThreadView,
    snapshot: ThreadSnapshot,
    budget: BudgetSpec,
    cache: ViewCache,
    earlier: tuple[SummaryView, ...] = (),
) -> PrepareProgress:
    """``progress`` starting at the least compressed depth of ``snapshot`` that may fit ``budget``: the
    summary stays for every budget no larger than the one the thread compacts ahead of."""
    depths = depths_of(snapshot, earlier)
    first = first_depth_reusing(cache, snapshot, depths, budget, view.compaction_budget)
    return replace(progress, depth=first, depths=len(depths))


def _counter(budget: BudgetSpec) -> TokenCounter | None:
    # A profile without an offline tokenizer is counted in o200k, times its calibration.
    if budget.learns_from_usage:
        return counter_for("o200k_base")
    for name in ENCODINGS:
        if name == budget.encoding:
            known: EncodingName = name
            return counter_for(known)
    return None


def _task_budget(
    view: ThreadView, request: PrepareRequest, budget: BudgetSpec, counter: TokenCounter | None
) -> TaskBudgetReport | None:
    """The run's task budget report, or the refusal when a hard one is spent (before any assembly).

    The prepare's own budget, else the one the run declared on its first event.
    """
    declared = request.task_budget or view.scope.task_budget
    if declared is None:
        return None
    thread_id = view.head.thread_id
    spent = ledger_of(
        view.records,
        own_thread=thread_id,
        input_budget=budget.input_budget,
        encoding=counter.name if counter else "o200k_base",
    )
    report = task_budget_report(declared, spent)
    ensure_within(report, thread_id)
    return report


class PrepareService:
    """Prepares contexts and inspections for any thread."""

    def __init__(
        self,
        store: PrepareStore,
        board: NoticeBoard,
        *,
        loader: ViewLoader | None = None,
        queue: JobQueue | None = None,
        compaction_wait_ms: int = 5_000,
        hooks: HookRegistry | None = None,
        on_stage: PrepareStages = ignore_stage,
    ) -> None:
        self._store = store
        # Told the wait, load and assemble seconds of each prepare as they end (services/app/step_timing.py).
        self._on_stage = on_stage
        self._board = board
        self._loader = loader or ViewLoader()
        self._queue = queue
        self._compaction_wait_ms = compaction_wait_ms
        self._unqueued_warned = float("-inf")
        self._windows = WindowKeeper(store, self._loader)
        # The gateway's final check, which validated the additions a re-prepare carries.
        self.gateway: GatewayService | None = None
        self._hooks = hooks
        # The loader's: what a prepare learns, the budgeter and compactor of this process see at once.
        self._calibrations = self._loader.calibrations

    async def preview(
        self, request: PrepareRequest, *, tenant: str = DEFAULT_TENANT
    ) -> tuple[PreparedContext, tuple[str, ...]]:
        """What ``prepare`` would answer now, without writing anything, and what it would do that this
        only says.

        The same steps as ``prepare``, except those that write: a compaction the context needs is not
        asked for (the context is the one served while none has landed: without the oldest history
        awaiting it), a window that would close stays open, and usage teaches no calibration.
        """
        if request.after_overflow is not None:
            raise InvalidRequest("a preview does not recalibrate: after_overflow is for a prepare")
        would: list[str] = []
        prepared = await self._answer(request, tenant, NO_PAUSE, would)
        return prepared, tuple(would)

    async def prepare(
        self, request: PrepareRequest, *, tenant: str = DEFAULT_TENANT, pause: Pause = NO_PAUSE
    ) -> PreparedContext:
        """The prepared context of the request's thread, reflecting its watermark event.

        Args:
            request: What to prepare.
            tenant: Whose request it is (from the subject the server delivered it on): another
                tenant's thread is reported exactly like a missing one.
            pause: Released while the request only waits (for its event or a compaction), so the
                caller's compute slot serves other requests meanwhile.
        """
        return await self._answer(request, tenant, pause, None)

    async def _answer(
        self, request: PrepareRequest, tenant: str, pause: Pause, would: list[str] | None
    ) -> PreparedContext:
        """``prepare``, or with ``would`` its read-only ``preview``, which notes there what it skipped."""
        thread_id = thread_id_of(request.run_id, request.instance_id)
        base = resolve_budget(request, BUILTIN_PROFILES)
        # Read with the event it names, once the ledger holds it; otherwise in ``_prepare``.
        view: ThreadView | None = None
        if request.after_event_key is not None:
            started = time.perf_counter()
            view = await self._await_event(tenant, thread_id, request, pause)
            self._on_stage("wait", time.perf_counter() - started)
        # Only after the wait: a session's hook set is known once its first event is recorded, and a
        # prepare that raced its session's first event would otherwise run without the release's hooks.
        if self._hooks is None:
            return await self._prepare(request, base, tenant, pause, None, view, would)
        hook_set = await self._hooks.hooks_of(tenant, request.session_id)
        if hook_set is None:
            return await self._prepare(request, base, tenant, pause, None, view, would)
        hooked = PrepareHooks()
        hooks = (self._hooks, hook_set, hooked)
        prepared = await self._prepare(request, base, tenant, pause, hooks, view, would)
        return await after_prepare(self._hooks, hook_set, tenant, request, prepared, hooked.touches)

    async def _prepare(
        self,
        request: PrepareRequest,
        base: BudgetSpec,
        tenant: str,
        pause: Pause,
        hooks: tuple[HookRegistry, HookSet, PrepareHooks] | None,
        view: ThreadView | None,
        would: list[str] | None,
    ) -> PreparedContext:
        thread_id = thread_id_of(request.run_id, request.instance_id)
        counter = _counter(base)
        if view is None:  # it holds every commit the ledger held when the prepare was served
            started = time.perf_counter()
            view = await self._view(tenant, thread_id, request.session_id, request.principal_id)
            self._on_stage("load", time.perf_counter() - started)
        kill_point("prepare.before_reply")
        started = time.perf_counter()
        task = _task_budget(view, request, base, counter)
        prepared = await self._prepare_view(view, request, base, counter, tenant, pause, hooks, would)
        self._on_stage("assemble", time.perf_counter() - started)
        return prepared if task is None else prepared.model_copy(update={"task_budget": task})

    async def _prepare_view(
        self,
        view: ThreadView,
        request: PrepareRequest,
        base: BudgetSpec,
        counter: TokenCounter | None,
        tenant: str,
        pause: Pause,
        hooks: tuple[HookRegistry, HookSet, PrepareHooks] | None,
        would: list[str] | None,
    ) -> PreparedContext:
        snapshot = view.snapshot()
        if request.evidence:
            snapshot = replace(snapshot, evidence=await self._evidence(request))
        if request.carry_additions_from is not None:
            if self.gateway is None:
                raise InvalidRequest(
                    "carry_additions_from needs the gateway's check, which this process lacks"
                )
            carried = await self.gateway.carried(
                request.carry_additions_from, tenant=tenant, thread_id=view.head.thread_id
            )
            snapshot = replace(snapshot, additions=carried)
        if hooks is not None:
            registry, hook_set, hooked = hooks
            ran = await before_prepare(registry, hook_set, tenant, snapshot, request, counter)
            hooked.change, hooked.touches = ran.change, ran.touches
            snapshot = replace(snapshot, hooked=ran.change)
        if request.after_overflow is not None:
            raised = await self._after_overflow(
                view.head.thread_id, snapshot, base, request.after_overflow, tenant
            )
            progress = PrepareProgress(raised, after_overflow=True)
        else:
            rollover = view.policy.window.strategy is WindowStrategy.ROLLOVER
            progress = PrepareProgress(await self._calibration(tenant, base), rollover_window=rollover)
        return await self._loop(progress, view, snapshot, request, base, counter, tenant, pause, would)

    async def _loop(
        self,
        progress: PrepareProgress,
        view: ThreadView,
        snapshot: ThreadSnapshot,
        request: PrepareRequest,
        base: BudgetSpec,
        counter: TokenCounter | None,
        tenant: str,
        pause: Pause,
        would: list[str] | None,
    ) -> PreparedContext:
        """The prepare, step by step as ``next_step`` says (services/core/prepare_step.py): the one
        place that assembles. With ``would`` (a preview) every step that writes is noted there instead."""
        budget = calibrated(base, progress.calibration)
        earlier = await self._earlier(view, budget)
        progress = _depths(progress, view, snapshot, budget, self._loader.cache, earlier)
        measured_at = time.monotonic()  # when the window's measurement began: what a rollover took
        wait: _CompactionWait | None = None
        with ExitStack() as registered:
            while True:
                step = next_step(progress)
                match step:
                    case Assemble():
                        if step.measure_window:
                            measured_at = time.monotonic()
                        shown = depths_of(snapshot, earlier)[step.depth]
                        try:
                            outcome = assemble_reusing(
                                self._loader.cache,
                                shown,
                                request,
                                budget,
                                counter,
                                compaction_wait_ms=step.compaction_wait_ms,
                                allow_drop_history=step.allow_drop_history,
                                window_policy=view.policy.window,
                            )
                        except ContextBudgetExceeded as refused:
                            if not step.measure_window:
                                raise
                            # Past the window's red line: the next window may fit; if this one stays,
                            # its next assembly refuses the prepare.
                            decision = self._windows.decide(view, snapshot, refused, budget)
                            progress = replace(progress, decision=decision)
                            continue
                        if step.measure_window:
                            progress = replace(
                                progress, decision=self._windows.decide(view, snapshot, outcome, budget)
                            )
                        progress = replace(progress, depth=step.depth, outcome=outcome)
                    case RollOver(trigger) if would is not None:
                        would.append(
                            f"close this window ({trigger.value}) and answer from the next one; shown: "
                            "this window's context, as far as it fits"
                        )
                        progress = replace(progress, rolled=True)
                    case RollOver(trigger):
                        view, snapshot, report = await self._windows.roll_over(
                            view, snapshot, trigger, measured_at
                        )
                        progress = replace(progress, rolled=True, report=report, outcome=None)
                        earlier = ()
                        progress = _depths(progress, view, snapshot, budget, self._loader.cache)
                    case AwaitCompaction(_, reasons) if would is not None:
                        # Past a rollover the prepare answers from the next window, which needs none.
                        if not progress.rolled:
                            would.append(
                                f"ask for a {', '.join(reasons)} compaction and wait for it; shown: the "
                                "context it answers when none lands in time, without the oldest history"
                            )
                        progress = replace(progress, outcome=None, waited=CompactionWait(0, landed=False))
                    case AwaitCompaction(reserved, reasons):
                        if wait is None:
                            started = time.monotonic()
                            woken = registered.enter_context(self._board.waiting(view.head.thread_id))
                            wait = _CompactionWait(started, started + self._compaction_wait_ms / 1000, woken)
                        view, landed = await self._await_compaction(
                            view, request, budget, reserved, reasons, pause, wait
                        )
                        snapshot = _carried(view, snapshot)
                        waited = CompactionWait(int((time.monotonic() - wait.started) * 1000), landed)
                        earlier = ()  # what waited is assembled at the deepest depth of the new view
                        progress = replace(
                            progress, depths=len(depths_of(snapshot)), outcome=None, waited=waited
                        )
                    case RequestCompaction(_, reasons) if would is not None:
                        would.append(f"ask for a {', '.join(reasons)} compaction, without waiting for it")
                        progress = replace(progress, requested=True)
                    case RequestCompaction(reserved, reasons):
                        # It fits under the raised count already; the compaction makes room for the
                        # next steps, so it runs without this reply waiting on it (and without the
                        # budgeter's triggers deciding).
                        await self._request_job(view, budget, reserved, reasons)
                        progress = replace(progress, requested=True)
                    case Learn() if would is not None:
                        progress = replace(progress, learned=progress.calibration)
                    case Learn(prepared):
                        learned = await self._learn(
                            tenant, base, progress.calibration, snapshot, request, prepared
                        )
                        progress = replace(progress, learned=learned)
                    case Recount(calibration):
                        budget = calibrated(base, calibration)
                        progress = replace(progress, calibration=calibration, outcome=None)
                    case Done(prepared):
                        return prepared
                    case Refuse(over):
                        raise over.error()
                    case _:
                        assert_never(step)

    async def _earlier(self, view: ThreadView, budget: BudgetSpec) -> tuple[SummaryView, ...]:
        """The earlier summaries of the view's chain, for a budget larger than the one its committed
        summary was made for (a smaller one never shows them)."""
        row = view.state.summary
        if row is None or budget.input_budget <= view.compaction_budget:
            return ()
        held = self._loader.held_earlier(row.summary_id)
        if held is not None:
            return held
        async with self._store.connection() as store:
            return await self._loader.earlier_summaries(store, view)

    async def _calibration(self, tenant: str, budget: BudgetSpec) -> Calibration:
        """The profile's calibration (only profiles without an offline tokenizer have one from usage;
        any profile has one after a provider overflow)."""
        cached = self._calibrations.fresh(tenant, budget.profile)
        if cached is not None:
            return cached
        async with self._store.connection() as store:
            return await self._calibrations.get(store, tenant, budget.profile)

    async def _learn(
        self,
        tenant: str,
        budget: BudgetSpec,
        calibration: Calibration,
        snapshot: ThreadSnapshot,
        request: PrepareRequest,
        prepared: PreparedContext,
    ) -> Calibration:
        """The calibration after the request's usage report, when it says something about the profile."""
        usage = request.usage
        if not budget.learns_from_usage or usage is None or usage.view_revision != snapshot.view_revision:
            return calibration
        response = next((r.seq for r in snapshot.records if r.event_key == usage.response_event_key), None)
        local = request_tokens_before(prepared, response) if response is not None else None
        if local is None:
            return calibration
        async with self._store.connection() as store:
            learned = await store.update_calibration(
                tenant, budget.profile, lambda c: learn_from_usage(c, usage.input_tokens, local)
            )
        self._calibrations.put(tenant, budget.profile, learned)
        return learned

    async def _after_overflow(
        self,
        thread_id: str,
        snapshot: ThreadSnapshot,
        base: BudgetSpec,
        overflow: ProviderOverflow,
        tenant: str,
    ) -> Calibration:
        """The provider refused the previous context as too long: the profile's calibration raised from
        its figures, so that the prepare answers one smaller context (and forces the thread's
        compaction) — once per view.

        A second overflow on the same view is ``ProviderContextExceeded``: the fleet already counted
        more and compacted for that view, so shrinking again would be a loop, not a recovery.
        """
        if overflow.view_revision > snapshot.view_revision:
            # Each view may recalibrate once: a view that does not exist yet would be a way around that.
            raise InvalidRequest(
                f"after_overflow names view {overflow.view_revision}; thread {thread_id} is at view "
                f"{snapshot.view_revision}"
            )
        async with self._store.connection() as store:
            async with store.transaction():
                if not await store.note_overflow(thread_id, base.profile, overflow):
                    current = await store.read_calibration(tenant, base.profile)
                    raise ProviderContextExceeded(
                        base.profile,
                        overflow.view_revision,
                        provider_limit=overflow.provider_limit,
                        provider_count=overflow.provider_count,
                        our_estimate=overflow.our_estimate,
                        calibration_factor=current.factor,
                    )
                raised = await store.update_calibration(
                    tenant,
                    base.profile,
                    lambda c: raise_on_overflow(
                        c, overflow.our_estimate, overflow.provider_count, overflow.provider_limit
                    ),
                )
        self._calibrations.put(tenant, base.profile, raised)
        return raised

    async def _evidence(self, request: PrepareRequest) -> tuple[Evidence, ...]:
        """The requested records of this session only, re-read and cut to their line ranges."""
        refs = [(e.thread_id, e.seq) for e in request.evidence]
        async with self._store.connection() as store:
            rows = await store.select_evidence(request.session_id, refs)
        out: list[Evidence] = []
        for ref in request.evidence:
            row = rows.get((ref.thread_id, ref.seq))
            if row is None:  # another session's record looks exactly like a missing one
                raise ContentNotFound(f"record {ref.seq} of {ref.thread_id}")
            # Externalized content is checked like a read-back: evidence is never a lookalike.
            if row.blob is None or row.blob_sha256 is None:
                text = row.text or ""
            else:
                text = verified_blob(row.blob, row.blob_sha256).decode("utf-8", "replace")
            if ref.start_line is not None:
                lines = text.splitlines(keepends=True)
                text = "".join(lines[ref.start_line - 1 : ref.end_line or ref.start_line])
            out.append(
                Evidence(
                    ref.thread_id, ref.seq, row.event_key, row.kind, row.content_sha256, row.record_hash, text
                )
            )
        return tuple(out)

    async def _view(
        self, tenant: str, thread_id: str, session_id: str, principal_id: str | None
    ) -> ThreadView:
        async with self._store.connection() as store:
            return await self._loader.load(
                store,
                thread_id,
                tenant=tenant,
                session_id=session_id,
                principal_id=principal_id,
                enforce_principal=True,
            )

    async def _await_compaction(
        self,
        view: ThreadView,
        request: PrepareRequest,
        budget: BudgetSpec,
        reserved: int,
        reasons: tuple[str, ...],
        pause: Pause,
        wait: _CompactionWait,
    ) -> tuple[ThreadView, bool]:
        """Ask for the thread's compaction and wait for a new view revision, up to the deadline: the
        view loaded last, and whether a new revision landed.

        When none lands in time, the context is served without the oldest history still awaiting
        compaction (each omission named in the reply): required content fits, so a prepare never
        fails for history the compactor has not caught up with.
        """
        thread_id = view.head.thread_id
        ours = await self._request_job(view, budget, reserved, reasons)
        revision = view.state.view_revision
        current = view
        while (remaining := wait.deadline - time.monotonic()) > 0:
            if isinstance(ours, _NotQueued):
                break  # no compaction is coming: answer now, without the oldest history
            wait.woken.clear()
            await wait_for_notice(wait.woken, min(remaining, RECHECK_S), pause)
            current = await self._view(view.scope.tenant, thread_id, request.session_id, request.principal_id)
            if current.state.view_revision != revision:
                return current, True
            if current.state.pending_fingerprint is not None:
                continue
            if ours is not None and ours.watermark == current.watermark:
                break  # our job ended without a commit (nothing to cover): waiting longer cannot help
            # Another job held the slot, or history grew since ours: ask for this state.
            ours = await self._request_job(current, budget, reserved, reasons)
        return current, False

    async def _request_job(
        self,
        view: ThreadView,
        budget: BudgetSpec,
        reserved: int,
        reasons: tuple[str, ...],
    ) -> CompactionJob | _NotQueued | None:
        """Ask for the thread's urgent compaction; the job, ``None`` while another one is pending, or
        ``_NOT_QUEUED`` when the queue refused it.

        A refused job does not fail the prepare: compaction is off the hot path, so the context is
        answered without it (within budget, the oldest history left out and named), and the
        budgeter asks again once the queue takes jobs.
        """
        if self._queue is None:
            return None
        try:
            async with self._store.connection() as store:
                return await request_job(
                    store,
                    self._queue,
                    view,
                    reasons,
                    urgent=True,
                    input_budget=budget.input_budget,
                    reserved_tokens=reserved,
                )
        except FleetUnavailable as exc:
            now = time.monotonic()
            if now - self._unqueued_warned >= _UNQUEUED_WARN_EVERY_S:
                self._unqueued_warned = now
                log.warning("prepares answered without compaction: %s", exc.message)
            return _NOT_QUEUED

    async def inspect(
        self, thread_id: str, request: InspectRequest, *, tenant: str = DEFAULT_TENANT
    ) -> ThreadInspection:
        """A thread's head, verified chain and latest records (``ThreadNotFound`` if not ``tenant``'s)."""
        async with self._store.connection() as store:
            head = await store.select_head(thread_id)
            if head is None or (await store.scope_of(thread_id)).tenant != tenant:
                raise ThreadNotFound(thread_id)
            count, tokens = await store.totals(thread_id)
            chain_error = verify_chain(thread_id, await store.select_links(thread_id))
            tail = await store.select_tail(thread_id, limit=request.limit, preview_chars=160)
            open_calls = await store.open_call_ids(thread_id)
            dead = await store.count_dead_letters(thread_id)
            recent_dead = await store.recent_dead_letters(thread_id, 10) if dead else []
            state = await store.load_view(thread_id)
            summaries = await store.summary_count(thread_id)
            stored = (await store.read_states([thread_id])).get(thread_id) or StateView()
            catalog = await store.read_session_catalog(head.session_id)
            replayed = rebuild_state(await store.select_full(thread_id), catalog)  # type: ignore[arg-type]
            closed = await store.windows_closed_after(thread_id)
        return ThreadInspection(
            thread_id=thread_id,
            session_id=head.session_id,
            revision=head.revision,
            record_count=count,
            total_tokens=tokens,
            last_event_key=head.last_event_key,
            chain_verified=chain_error is None,
            chain_error=chain_error,
            pending_call_ids=tuple(open_calls),
            dead_letters=dead,
            recent_dead_letters=tuple(recent_dead),
            records=tuple(
                r.model_copy(update={"window": window_of(r.session_seq, closed)}) for r in reversed(tail)
            ),
            view_revision=state.view_revision,
            summaries=summaries,
            summary_hooks=state.summary.hooks if state.summary else (),
            compaction_attempts=state.attempts,
            compaction_failures=state.failures,
            last_compaction_failure=state.last_failure,
            deferred_reason=state.deferred_reason,
            state_facts=len(stored.facts),
            state_hash=state_hash(stored),
            state_verified=state_hash(stored) == state_hash(replayed),
            window=len(closed) + 1,
        )

    async def _await_event(
        self, tenant: str, thread_id: str, request: PrepareRequest, pause: Pause
    ) -> ThreadView:
        """The view once the ledger holds the event the request names (``services/app/freshness.py``)."""
        assert request.after_event_key is not None
        return await view_after(
            self._store,
            self._loader,
            self._board,
            tenant=tenant,
            thread_id=thread_id,
            session_id=request.session_id,
            principal_id=request.principal_id,
            event_key=request.after_event_key,
            event_hash=request.after_event_hash,
            wait_ms=request.wait_ms,
            pause=pause,
        )
