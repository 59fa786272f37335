"""``ctxfleet rebaseline``: point the recorder's positions at the events stream as it is now.

When the events stream went backwards or was re-created (its JetStream store lost), the recorder
halts rather than skip what the new stream holds below its old positions. This shows what the
recorder sees and, when told to (``apply``), resets every committed position to just before the
stream's first sequence and records the stream's identity, in one transaction. Everything the
stream still holds is then read again: events already in the ledger are recognised by their event
key as duplicates, the rest are recorded. A running recorder notices within a few seconds and
resumes; a stopped one starts from the new positions.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js.errors import NotFoundError

from contracts.subjects import EVENTS_STREAM
from services.core.baseline import Positions, Rebaseline, StreamFacts, plan_rebaseline
from ctxfleet_client.client import connect_nats
from services.settings import Settings
from services.store.connect import create_pool
from services.store.postgres import PgStore

from .runtime import require_current_schema

__all__ = ["RebaselineError", "RebaselineReport", "format_report", "rebaseline"]

_CONSUMER = "recorder"


class RebaselineError(RuntimeError):
    """The re-baseline cannot be done as asked; the message says why and what to do."""


@dataclass(frozen=True)
class RebaselineReport:
    """What was seen, what the plan is, and whether it was written."""

    positions: Positions
    plan: Rebaseline
    applied: bool

    @property
    def stream(self) -> StreamFacts:
        return self.plan.verdict.stream


async def rebaseline(
    nats_urls: tuple[str, ...], database_url: str, settings: Settings, *, apply: bool
) -> RebaselineReport:
    """Compare the positions with the events stream and, if ``apply``, re-baseline them.

    Raises:
        RebaselineError: the stream does not exist, or positions moved while we wrote.
        SchemaBehind: the database lacks the migration that records stream identities.
    """
    await require_current_schema(database_url, settings)
    nc = await connect_nats(nats_urls, name="ctxfleet-rebaseline", **settings.bus.nats_options())
    try:
        js = nc.jetstream(timeout=10.0)
        pool = await create_pool(database_url, min_size=1, max_size=1, **settings.store.database_options())
        try:
            # The positions are locked while we read the stream and write, so a recorder that has
            # not halted yet cannot advance one between our read and our reset.
            async with PgStore(pool).locked_positions(_CONSUMER, EVENTS_STREAM) as locked:
                positions = locked.positions
                try:
                    info = await js.stream_info(EVENTS_STREAM)
                except NotFoundError:
                    raise RebaselineError(
                        f"the events stream {EVENTS_STREAM} does not exist: run 'ctxfleet provision' first"
                    ) from None
                if info.created is None:
                    raise RebaselineError(
                        f"{EVENTS_STREAM}: the server reported no creation time (nats-server >= 2.10 does)"
                    )
                stream = StreamFacts(EVENTS_STREAM, info.state.first_seq, info.state.last_seq, info.created)
                plan = plan_rebaseline(positions, stream)
                if apply and plan.resets:
                    if not await locked.lower(stream.created, plan.resets):
                        raise RebaselineError(
                            "a position moved while re-baselining (is a recorder still recording?); "
                            "run it again"
                        )
                elif apply and plan.needed:
                    await locked.adopt(stream.created)
        finally:
            await pool.close()
    finally:
        await nc.close()
    return RebaselineReport(positions, plan, applied=apply and plan.needed)


def format_report(report: RebaselineReport) -> str:
    """What the command prints: the stream, each partition's position, the verdict and what was done."""
    s, plan, positions = report.stream, report.plan, report.positions
    recorded = positions.created.isoformat() if positions.created else "none recorded yet"
    lines = [
        f"events stream {s.name}: first seq {s.first_seq}, last seq {s.last_seq}, "
        f"created {s.created.isoformat()}",
        f"positions were read from the stream created: {recorded}",
    ]
    resets = {r.partition: r.new for r in plan.resets}
    if positions.by_partition:
        lines.append(f"{'partition':>9}  {'committed':>10}  {'after':>10}")
        for partition, seq in sorted(positions.by_partition.items()):
            after = resets.get(partition, seq)
            mark = "" if after == seq else "  <- reset"
            lines.append(f"{partition:>9}  {seq:>10}  {after:>10}{mark}")
    else:
        lines.append("no committed positions (nothing recorded yet)")
    verdict = plan.verdict
    lines.append(verdict.reason or f"positions match the stream ({verdict.kind}): nothing to re-baseline")
    start = max(0, s.first_seq - 1)
    if not plan.resets:
        if report.applied:
            lines.append(f"recorded the identity of {s.name} (created {s.created.isoformat()})")
    elif report.applied:
        lines.append(
            f"reset {len(plan.resets)} positions to {start}: recording resumes from seq {start + 1}; "
            "events already recorded are recognised as duplicates"
        )
    else:
        lines.append(
            f"dry run, nothing changed: run 'ctxfleet rebaseline --yes' to reset {len(plan.resets)} "
            f"positions to {start}"
        )
    return "\n".join(lines)
