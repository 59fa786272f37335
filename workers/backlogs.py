"""Backlog gauges: what operators scale and alert on — the compaction queue and each worker's lag."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from contracts import JOBS_STREAM

from .budgeter import BudgeterWorker
from .compactor import COMPACTOR_DURABLE
from .indexer import IndexerWorker
from .metrics import FleetMetrics
from .recorder import RecorderWorker

__all__ = ["export_backlogs", "parse_nats_time", "watch_backlogs"]

log = logging.getLogger("ctxfleet")


def parse_nats_time(value: str) -> datetime | None:
    """A NATS timestamp as an aware datetime; ``None`` if it is not one."""
    # NATS sends RFC 3339 with nanoseconds; Python parses at most microseconds.
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?", value)
    if match is None:
        return None
    fraction = (match.group(2) or ".0")[:7]
    return datetime.fromisoformat(match.group(1) + fraction).replace(tzinfo=UTC)


async def export_backlogs(
    nc: NatsClient,
    names: tuple[str, ...],
    metrics: FleetMetrics,
    recorder: RecorderWorker | None,
    budgeter: BudgeterWorker | None,
    indexer: IndexerWorker | None,
) -> None:
    """Set the compaction queue gauges and ``ctx_consumer_lag_*`` for the workers ``names`` here."""
    js = nc.jetstream(timeout=5.0)
    if "compactor" in names or "budgeter" in names:
        info = await js.stream_info(JOBS_STREAM)
        metrics.queue_jobs.set(info.state.messages)
        age = 0.0
        if info.state.messages:
            try:
                first = await js.get_msg(JOBS_STREAM, info.state.first_seq)
            except NotFoundError:
                first = None  # a compactor acked it between the two calls: the queue moved on
            stamp = first.time if first is not None else None
            if isinstance(stamp, str):
                stamp = parse_nats_time(stamp)
            if isinstance(stamp, datetime):
                age = (datetime.now(UTC) - stamp).total_seconds()
        metrics.queue_oldest_age.set(max(0.0, age))
    if "compactor" in names:
        consumer = await js.consumer_info(JOBS_STREAM, COMPACTOR_DURABLE)
        metrics.consumer_lag_jobs.labels(worker="compactor", consumer=COMPACTOR_DURABLE).set(
            consumer.num_pending + consumer.num_ack_pending
        )
    if recorder is not None:
        for partition, pending in (await recorder.lag()).items():
            metrics.consumer_lag_events.labels(worker="recorder", consumer=f"p{partition}").set(pending)
    if budgeter is not None:
        metrics.consumer_lag_threads.labels(worker="budgeter").set(budgeter.backlog)
    if indexer is not None:
        metrics.consumer_lag_threads.labels(worker="indexer").set(indexer.backlog)


async def watch_backlogs(
    export: Callable[[], Awaitable[None]], draining: Callable[[], bool], every_s: float = 5.0
) -> None:
    """Call ``export`` every ``every_s`` until ``draining()``; a failing round is logged, never raised."""
    # Ends on the flag, not only on cancellation: a cancel that lands in a client library's own
    # wait_for can be swallowed (Python 3.11), and this loop would then run on for ever.
    while not draining():
        try:
            await export()
        except Exception as exc:  # a metrics loop must never take the worker down
            log.debug("backlog metrics: %s", exc)
        await asyncio.sleep(every_s)
