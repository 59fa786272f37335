"""Putting compaction jobs on the queue: one pending job per thread, named by the state it covers;
and which threads have idled long enough for their provider's prompt cache to go cold."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from contracts import CompactionJob

from services.core.compaction.policy import IDLE_MARGIN_S, PROVIDER_CACHE_TTL_S, job_fingerprint
from services.store.ports import ViewWrites
from services.app.views import ThreadView

__all__ = [
    "IdleSpell",
    "IdleWatch",
    "JobQueue",
    "PENDING_STALE_S",
    "cache_ttl_for",
    "compaction_job",
    "request_job",
]

# A job that has not finished in this long is presumed lost (its compactor died past redelivery).
PENDING_STALE_S = 300.0


class JobQueue(Protocol):
    """The work queue of compaction jobs; publishing the same job id twice must store it once."""

    async def publish(self, job: CompactionJob) -> None:
        """Enqueue one job."""


async def request_job(
    store: ViewWrites,
    queue: JobQueue,
    view: ThreadView,
    reasons: tuple[str, ...],
    *,
    urgent: bool = False,
    input_budget: int | None = None,
    reserved_tokens: int = 0,
) -> CompactionJob | None:
    """Enqueue a job for the view's current state unless the thread already has one pending.

    ``input_budget`` (a prepare's own, smaller budget) overrides the policy's for an urgent job;
    ``reserved_tokens`` is what that prepare needs besides the view (its tool schemas).
    """
    budget = min(view.budget.input_budget, input_budget) if input_budget else view.compaction_budget
    reserved_tokens = reserved_tokens if input_budget else max(reserved_tokens, view.state.prepare_reserved)
    job = compaction_job(view, reasons, budget, reserved_tokens, urgent=urgent)
    await store.ensure_view(view.head.thread_id)
    if urgent and input_budget and input_budget < view.budget.input_budget:
        await store.note_prepare_budget(view.head.thread_id, budget, reserved_tokens)
    if not await store.set_pending(view.head.thread_id, job.job_id, stale_after_s=PENDING_STALE_S):
        return None
    try:
        await queue.publish(job)
    except BaseException:
        await store.clear_pending(view.head.thread_id, job.job_id)
        raise
    return job


def compaction_job(
    view: ThreadView,
    reasons: tuple[str, ...],
    budget: int,
    reserved_tokens: int,
    *,
    urgent: bool = False,
    id_prefix: str = "",
) -> CompactionJob:
    """The job for the view's current state, named by its fingerprint (a pure step)."""
    fingerprint = job_fingerprint(
        view.head.thread_id,
        view.watermark,
        view.state.view_revision,
        view.policy_name,
        view.policy_revision,
        budget,
        urgent=urgent,
    )
    return CompactionJob(
        job_id=id_prefix + fingerprint,
        thread_id=view.head.thread_id,
        session_id=view.head.session_id,
        watermark=view.watermark,
        view_revision=view.state.view_revision,
        policy_name=view.policy_name,
        policy_revision=view.policy_revision,
        input_budget=budget,
        reasons=reasons,
        urgent=urgent,
        reserved_tokens=reserved_tokens,
    )


def cache_ttl_for(profile: str) -> float:
    """The prompt-cache TTL of the provider a budget profile serves (``claude-*``: Anthropic's)."""
    provider = "anthropic" if profile.startswith("claude") else "openai"
    return PROVIDER_CACHE_TTL_S[provider]


@dataclass(frozen=True, slots=True)
class IdleSpell:
    """How long a thread has idled, and the cache TTL of the provider it was last served for."""

    thread_id: str
    idle_s: float
    ttl_s: float


class IdleWatch:
    """The threads a process saw move, and when: those idle nearly a cache TTL are due a look.

    A thread moves when records land; the prepare for the next model call follows them within a
    step, so the time of its last records stands for the time its last context was served (the
    provider cache's clock). A thread is due once per idle spell: ``take`` forgets it until it moves
    again. In memory and per process: a restart forgets the spells under way, which only costs the
    cheaper view those threads would have had after their pause.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        *,
        margin_s: float = IDLE_MARGIN_S,
        max_threads: int = 100_000,
    ) -> None:
        self._clock = clock
        self._margin_s = margin_s
        self._max_threads = max_threads
        self._moved: dict[str, tuple[float, float]] = {}

    def moved(self, thread_id: str, ttl_s: float) -> None:
        """``thread_id`` has just moved, served by a provider whose cache keeps a prefix ``ttl_s``."""
        self._moved.pop(thread_id, None)
        if len(self._moved) >= self._max_threads:
            # The one idle longest goes first: a bounded watch, at the cost of that thread's spell.
            self._moved.pop(next(iter(self._moved)))
        self._moved[thread_id] = (self._clock(), ttl_s)

    def due(self) -> list[str]:
        """The threads idle for their TTL less the margin: the ones to look at now."""
        now = self._clock()
        return [t for t, (at, ttl) in self._moved.items() if now - at >= ttl - self._margin_s]

    def take(self, thread_id: str) -> IdleSpell | None:
        """The spell of a due thread, which is forgotten until it moves again; ``None`` if not due."""
        moved = self._moved.get(thread_id)
        if moved is None:
            return None
        at, ttl = moved
        idle = self._clock() - at
        if idle < ttl - self._margin_s:
            return None
        del self._moved[thread_id]
        return IdleSpell(thread_id, idle, ttl)
