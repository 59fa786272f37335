"""Context hooks of a release: registration, the session's pinned set, calling a hook under its policy.

A session's hook set is fixed once its first event is recorded (a later registration only reaches
later sessions), so it is cached per session: a prepare of a session whose release has no hooks
reads the store once per process, not once per prepare.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, assert_never

from contracts import Purpose
from contracts.hook_protocol import HookCall, HookDecision, HookPatch, HookReply
from contracts.hooks import AdditionCategory, HookBinding, HookFailurePolicy, HookPoint, HookSet

from contracts.exceptions import CtxError, HookChangeRefused, HookRejected, HookTimeout
from services.app.tracing import Tracing, record_outcome
from services.core.hook_patches import HOOK_REFUSED
from services.store.hook_sets import PinnedHooks
from services.store.ports import HookStore

__all__ = [
    "HookObserver",
    "HookOutcome",
    "HookRegistry",
    "HookResult",
    "HookRunner",
]

HookOutcome = str  # ok, patched, rejected, refused, timeout, error (the metric's label values)
# Sessions whose hook set a process remembers; a miss costs one store read.
_CACHE_SESSIONS = 4096


class HookRunner(Protocol):
    """Sends a hook its call and waits up to its timeout (``HookTimeout``; ``HookFailed`` otherwise)."""

    async def call(self, binding: HookBinding, call: HookCall) -> HookReply: ...


class HookObserver(Protocol):
    def observe(self, point: HookPoint, outcome: HookOutcome, seconds: float) -> None: ...


class _Unobserved:
    def observe(self, point: HookPoint, outcome: HookOutcome, seconds: float) -> None:
        return None


@dataclass(frozen=True, slots=True)
class HookResult:
    """One hook's answer after its policy: the patch to use (``None``: nothing), and the note."""

    binding: HookBinding
    patch: HookPatch | None
    outcome: HookOutcome
    note: str | None = None


class HookRegistry:
    """The hook sets of sessions, and calling their hooks."""

    def __init__(
        self,
        store: HookStore,
        runner: HookRunner,
        observer: HookObserver | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self._store = store
        self._runner = runner
        self._observer = observer or _Unobserved()
        self._tracing = tracing or Tracing.off()
        self._sessions: OrderedDict[tuple[str, str], PinnedHooks | None] = OrderedDict()

    async def register(self, tenant: str, hooks: HookSet) -> int:
        return await self._store.register_hooks(tenant, hooks)

    async def hooks_of(self, tenant: str, session_id: str) -> HookSet | None:
        """The hook set the session pinned (``None``: its release has none)."""
        pinned = await self.pinned_of(tenant, session_id)
        return None if pinned is None else pinned.hooks

    async def pinned_of(self, tenant: str, session_id: str) -> PinnedHooks | None:
        """The hook set the session pinned with its revision (``None``: its release has none)."""
        key = (tenant, session_id)
        if key in self._sessions:
            self._sessions.move_to_end(key)
            return self._sessions[key]
        recorded, pinned = await self._store.session_hooks(tenant, session_id)
        hooks = pinned if pinned is not None and pinned.hooks.hooks else None
        if recorded:
            # Only a recorded session's answer is final; an unknown one may yet be recorded.
            self._sessions[key] = hooks
            if len(self._sessions) > _CACHE_SESSIONS:
                self._sessions.popitem(last=False)
        return hooks

    async def granted(self, tenant: str, session_id: str) -> dict[str, frozenset[AdditionCategory]]:
        """What each hook of the session may add: ``{name@version: categories}`` (the gateway's
        ``HookGrants`` port)."""
        hooks = await self.hooks_of(tenant, session_id)
        if hooks is None:
            return {}
        return {h.source: frozenset(h.grants) for h in hooks.hooks if h.grants}

    @staticmethod
    def bindings(hooks: HookSet | None, point: HookPoint, purpose: Purpose) -> list[HookBinding]:
        """The hooks that run at ``point`` for ``purpose``, in registration order."""
        if hooks is None:
            return []
        return [h for h in hooks.hooks if h.point is point and purpose in h.runs_for]

    async def run(
        self, binding: HookBinding, call: HookCall, check: Callable[[HookPatch], list[str]]
    ) -> HookResult:
        """Call one hook and apply its failure policy: a ``skip`` failure is a note, a ``fail`` one raises."""
        with self._tracing.hook(binding, call) as span:
            try:
                result = await self._run(binding, call, check)
            except CtxError as exc:
                if span.is_recording():
                    record_outcome(span, _outcome_of(exc))
                raise
            if span.is_recording():
                record_outcome(span, result.outcome)
            return result

    async def _run(
        self, binding: HookBinding, call: HookCall, check: Callable[[HookPatch], list[str]]
    ) -> HookResult:
        started = time.monotonic()
        point = binding.point
        try:
            reply = await self._runner.call(binding, call)
        except HookTimeout as exc:
            return self._failed(binding, "timeout", exc, started)
        except CtxError as exc:
            return self._failed(binding, "error", exc, started)
        elapsed = time.monotonic() - started
        match reply.decision:
            case HookDecision.CONTINUE:
                self._observer.observe(point, "ok", elapsed)
                return HookResult(binding, None, "ok")
            case HookDecision.REJECT:
                self._observer.observe(point, "rejected", elapsed)
                raise HookRejected(binding.source, point.value, reply.reason or "(no reason given)")
            case HookDecision.PATCH:
                problems = check(reply.patch)
                if not problems:
                    self._observer.observe(point, "patched", elapsed)
                    return HookResult(binding, reply.patch, "patched")
                self._observer.observe(point, "refused", elapsed)
                refused = HookChangeRefused(binding.source, point.value, problems)
                if binding.failure is HookFailurePolicy.FAIL:
                    raise refused
                return HookResult(
                    binding, None, "refused", f"{binding.source}: {HOOK_REFUSED}: {refused.message}"
                )
            case _:
                assert_never(reply.decision)

    def _failed(
        self, binding: HookBinding, outcome: HookOutcome, exc: CtxError, started: float
    ) -> HookResult:
        self._observer.observe(binding.point, outcome, time.monotonic() - started)
        match binding.failure:
            case HookFailurePolicy.FAIL:
                raise exc
            case HookFailurePolicy.SKIP:
                return HookResult(binding, None, outcome, f"{binding.source}: {exc.code.value}: skipped")
            case _:
                assert_never(binding.failure)


def _outcome_of(exc: CtxError) -> HookOutcome:
    # The outcome a raising call counts under in ``ctx_hook_calls_total``.
    if isinstance(exc, HookRejected):
        return "rejected"
    if isinstance(exc, HookChangeRefused):
        return "refused"
    if isinstance(exc, HookTimeout):
        return "timeout"
    return "error"
