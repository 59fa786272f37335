"""What a thread's next prepare would answer, shown to a person without preparing it.

``ctxfleet context`` and the console's context page both show a thread's context through
:func:`show_context`, so they show the same one: under the session's pinned policy unless the
request names a profile or a budget, and by ``PrepareService.preview``, which writes nothing — a
compaction or a rollover the prepare would start is said, not done.
"""

from __future__ import annotations

from contracts import ContextRequest, ContextShown, PrepareRequest
from contracts.ids import split_thread_id
from contracts.subjects import DEFAULT_TENANT
from services.app.budgeting import measure
from services.app.preparing import PrepareService
from services.app.views import ViewLoader
from services.core.history_depth import in_full
from contracts.exceptions import InvalidPolicy, ThreadNotFound
from services.store.ports import PrepareStore

__all__ = ["show_context"]


async def show_context(
    store: PrepareStore, service: PrepareService, thread_id: str, asked: ContextRequest, *, tenant: str
) -> ContextShown:
    """The context ``thread_id``'s next prepare would answer, and where its budget came from.

    Raises:
        ThreadNotFound: ``tenant`` has no such thread.
        InvalidPolicy: the session's pinned policy is not registered.
    """
    run_id, instance_id = split_thread_id(thread_id)
    async with store.connection() as s:
        head = await s.select_head(thread_id)
        if head is None or (scope := await s.scope_of(thread_id)).tenant != tenant:
            raise ThreadNotFound(thread_id)
        pinned = await s.session_policy(head.session_id) or (DEFAULT_TENANT, "default", 1)
        found = await s.get_policy(*pinned)
    if found is None:
        raise InvalidPolicy(f"policy {pinned[1]}@{pinned[2]} of session {head.session_id} is not registered")
    revision, policy = found
    name = f"{policy.name}@{revision}"
    named = asked.model_profile is not None or asked.profile is not None
    request = PrepareRequest(
        session_id=head.session_id,
        principal_id=scope.principal_id,
        run_id=run_id,
        instance_id=instance_id,
        model_profile=asked.model_profile if named else policy.model_profile,
        profile=asked.profile if named else policy.profile,
        budget_tokens=asked.budget_tokens or (None if named else policy.budget_tokens),
        wait_ms=0,
    )
    prepared, would = await service.preview(request, tenant=tenant)
    async with store.connection() as s:
        view = await ViewLoader().load(s, thread_id, tenant=tenant)
    # Measured as a manual compaction measures the view, with no summary in place of any record: what
    # ``ctxfleet compact`` reports as its before on a thread no summary stands in yet.
    history, _, _ = measure(
        view,
        view.records,
        budget=view.compaction_budget,
        reserved=view.state.prepare_reserved,
        snapshot=in_full(view.snapshot()),
    )
    return ContextShown(
        prepared=prepared,
        policy=name,
        budget_source=_budget_source(asked, name),
        runtime_would=would,
        history_tokens=history.estimated,
    )


def _budget_source(asked: ContextRequest, policy: str) -> str:
    if asked.model_profile is not None:
        source = f"model profile {asked.model_profile}, as asked"
    elif asked.profile is not None:
        source = f"profile {asked.profile.name}, as given"
    else:
        source = f"the session's policy {policy}"
    return source + (f", capped at {asked.budget_tokens} tokens as asked" if asked.budget_tokens else "")
