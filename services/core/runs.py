"""Sessions, runs and threads as the recorder sees them: who may write where. Pure.

Rules, one check each:

1. A session belongs to one principal and one agent release, fixed by its first event
   (``_check_principal``, ``_check_release``).
2. A new run is a new question: its first thread is the run's main thread, and it may start only
   while no other run of the session is active (``_check_new_thread``).
3. Another instance of a running run is a child and must name its parent instance; the parent
   must exist in the same run (``_check_new_thread``).
4. Writing to a run that is not active resumes it — only when no other run is active (``_check_resume``).
5. A child's exported background may only reference records of its own parent (``_check_export``).
6. ``run_status`` belongs to main threads; ``context_export`` to child threads (``_check_kind``).
7. A run's task budget is its first event's; on any later event, or a child's, ``task_budget`` is
   not honoured (as ``policy`` on a later event of a session) (``_check_new_thread``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from contracts import ContextExportEvent, ContextResetEvent, Event, RunStatusEvent, thread_id_of
from contracts.task_budgets import TaskBudget

from contracts.exceptions import (
    GrantViolation,
    InvalidEvent,
    ReleaseMismatch,
    RunActive,
    ScopeViolation,
    UnknownInstance,
)

__all__ = ["Lifecycle", "LifecycleChange", "RunState", "ThreadMeta"]


@dataclass(frozen=True, slots=True)
class RunState:
    run_id: str
    session_id: str
    status: str
    main_thread_id: str
    # Declared on the run's first event (its envelope's ``task_budget``); kept with the run.
    task_budget: TaskBudget | None = None


@dataclass(frozen=True, slots=True)
class ThreadMeta:
    """What the lifecycle needs of an existing thread."""

    thread_id: str
    session_id: str
    role: str
    parent_thread_id: str | None
    last_seq: int


@dataclass(frozen=True, slots=True)
class LifecycleChange:
    """What accepting one event changes: a new run or thread, a run status, a reset."""

    new_run: RunState | None = None
    new_thread: ThreadMeta | None = None
    run_status: tuple[str, str] | None = None
    principal: tuple[str, str] | None = None
    release: tuple[str, str] | None = None
    reset_session: str | None = None


class Lifecycle:
    """Run and thread state across one batch, starting from what the store read. What the batch writes
    is what it added to that read, and every run status it set."""

    def __init__(
        self,
        runs: Mapping[str, RunState],
        active: Mapping[str, str],
        threads: Mapping[str, ThreadMeta],
        principals: Mapping[str, str | None],
        releases: Mapping[str, str | None],
    ) -> None:
        self._read_runs, self._read_threads = runs, threads
        self._read_principals, self._read_releases = principals, releases
        self.runs, self.active, self.threads = dict(runs), dict(active), dict(threads)
        self.principals, self.releases = dict(principals), dict(releases)
        # Also a status equal to the one stored: the store writes each status an event sets.
        self.run_statuses: dict[str, str] = {}

    def written(self) -> tuple[tuple[RunState, ...], dict[str, ThreadMeta], dict[str, str], dict[str, str]]:
        """The runs, threads, principals and releases the batch added to the read."""
        runs = tuple(run for run_id, run in self.runs.items() if run_id not in self._read_runs)
        threads = {t: meta for t, meta in self.threads.items() if t not in self._read_threads}
        principals = {
            s: p for s, p in self.principals.items() if s not in self._read_principals and p is not None
        }
        releases = {s: r for s, r in self.releases.items() if s not in self._read_releases and r is not None}
        return runs, threads, principals, releases

    def check(self, event: Event, thread_id: str, *, session_known: bool) -> LifecycleChange:
        """Raise InvalidEvent unless the event may be recorded; what it would change otherwise."""
        principal = self._check_principal(event, session_known)
        release = self._check_release(event, session_known)
        meta = self.threads.get(thread_id)
        if meta is None:
            change = self._check_new_thread(event, thread_id)
        else:
            change = self._check_resume(event, meta)
        thread = change.new_thread or meta
        self._check_kind(event, thread.role if thread else "main")
        self._check_export(event, thread.parent_thread_id if thread else None)
        status = (
            (event.run_id, event.payload.status) if isinstance(event, RunStatusEvent) else change.run_status
        )
        reset = event.session_id if isinstance(event, ContextResetEvent) else None
        return LifecycleChange(change.new_run, change.new_thread, status, principal, release, reset)

    def apply(self, change: LifecycleChange, thread_id: str, seq: int) -> None:
        """Remember an accepted event's change, recorded at ``seq`` of ``thread_id``."""
        if change.principal is not None:
            self.principals[change.principal[0]] = change.principal[1]
        if change.release is not None:
            self.releases[change.release[0]] = change.release[1]
        if change.new_run is not None:
            self.runs[change.new_run.run_id] = change.new_run
            self.active[change.new_run.session_id] = change.new_run.run_id
        if change.new_thread is not None:
            self.threads[thread_id] = change.new_thread
        if change.run_status is not None:
            run_id, status = change.run_status
            run = self.runs[run_id]
            self.runs[run_id] = replace(run, status=status)
            self.run_statuses[run_id] = status
            if status == "active":
                self.active[run.session_id] = run_id
            elif self.active.get(run.session_id) == run_id:
                del self.active[run.session_id]
        if (meta := self.threads.get(thread_id)) is not None:
            self.threads[thread_id] = replace(meta, last_seq=seq)

    def _check_principal(self, event: Event, session_known: bool) -> tuple[str, str] | None:
        owner = self.principals.get(event.session_id)
        if event.principal_id is None:
            return None
        if session_known or event.session_id in self.principals:
            if owner is not None and owner != event.principal_id:
                raise ScopeViolation(event.thread_id, event.session_id, owner)
            return None
        return (event.session_id, event.principal_id)

    def _check_release(self, event: Event, session_known: bool) -> tuple[str, str] | None:
        pinned = self.releases.get(event.session_id)
        if event.agent_release is None:
            return None
        if session_known or event.session_id in self.releases:
            if pinned is not None and pinned != event.agent_release:
                raise ReleaseMismatch(event.session_id, pinned, event.agent_release)
            return None
        return (event.session_id, event.agent_release)

    def _check_new_thread(self, event: Event, thread_id: str) -> LifecycleChange:
        run = self.runs.get(event.run_id)
        if event.parent_instance_id is not None:
            parent = self.threads.get(thread_id_of(event.run_id, event.parent_instance_id))
            if parent is None or parent.session_id != event.session_id:
                raise UnknownInstance(
                    thread_id,
                    f"parent instance {event.parent_instance_id} has no thread in run {event.run_id}",
                )
            return LifecycleChange(
                new_thread=ThreadMeta(thread_id, event.session_id, "child", parent.thread_id, 0)
            )
        if run is not None:
            if run.session_id != event.session_id:
                raise ScopeViolation(thread_id, event.session_id, run.session_id)
            raise UnknownInstance(
                thread_id,
                f"run {event.run_id} already has main thread {run.main_thread_id}; "
                "a child names parent_instance_id",
            )
        other = self.active.get(event.session_id)
        if other is not None:
            raise RunActive(event.session_id, other, event.run_id)
        new_run = RunState(event.run_id, event.session_id, "active", thread_id, event.task_budget)
        return LifecycleChange(
            new_run=new_run, new_thread=ThreadMeta(thread_id, event.session_id, "main", None, 0)
        )

    def _check_resume(self, event: Event, meta: ThreadMeta) -> LifecycleChange:
        if meta.role != "main" or isinstance(event, RunStatusEvent):
            return LifecycleChange()
        run = self.runs.get(event.run_id)
        if run is None or run.status == "active":
            return LifecycleChange()
        other = self.active.get(event.session_id)
        if other is not None and other != event.run_id:
            raise RunActive(event.session_id, other, event.run_id)
        return LifecycleChange(run_status=(event.run_id, "active"))

    @staticmethod
    def _check_kind(event: Event, role: str) -> None:
        if isinstance(event, RunStatusEvent) and role != "main":
            raise InvalidEvent("run_status belongs to the run's main thread")
        if isinstance(event, ContextExportEvent) and role != "child":
            raise InvalidEvent("context_export is published into a child's thread")

    def _check_export(self, event: Event, parent: str | None) -> None:
        if not isinstance(event, ContextExportEvent):
            return
        parent_meta = self.threads.get(parent or "")
        for ref in event.payload.refs:
            if (
                parent_meta is None
                or ref.thread_id != parent_meta.thread_id
                or ref.seq > parent_meta.last_seq
            ):
                raise GrantViolation(event.thread_id, ref.thread_id, ref.seq)
