"""The Python client of the fleet, as agent runtimes and the CLI use it.

``append`` publishes an event to JetStream with ``Nats-Msg-Id`` = thread + event key, so a retried
publish is dropped by the server within its window and by the recorder after it. ``prepare``
asks the assembler (request/reply) and raises the typed error of an error reply.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import ConnectionClosedError, MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext

from contracts import (
    SEARCH,
    SearchReply,
    SearchRequest,
    OPERATION_STATUS,
    OperationStatusRequest,
    Receipt,
    TOOLS_REGISTER,
    CatalogRegistered,
    ToolCatalog,
    POLICY_REGISTER,
    READ,
    ContextPolicy,
    ErrorReply,
    Event,
    InspectRequest,
    PolicyRegistered,
    PreparedContext,
    PrepareRequest,
    ReadReply,
    ReadRequest,
    SessionInspection,
    ThreadInspection,
    session_inspect_subject,
)
from contracts.ids import is_identifier
from contracts.subjects import EVENTS_STREAM, events_subject, inspect_subject, prepare_subject

from .errors import CtxError, FleetUnavailable, PayloadTooLarge, error_from_reply
from .settings import redact_url

__all__ = ["AppendAck", "FleetClient", "connect_nats", "msg_id_of"]


@dataclass(frozen=True, slots=True)
class AppendAck:
    """Where JetStream stored an event, and whether it was a duplicate publish."""

    stream_seq: int
    duplicate: bool


def msg_id_of(thread_id: str, event_key: str, data: bytes) -> str:
    """The ``Nats-Msg-Id`` of an event: thread, key and a digest of the exact bytes.

    JetStream then drops only byte-identical retries. Anything else under a known key (a conflicting
    reuse, another session claiming the thread) reaches the recorder, which rejects it with a
    reason instead of the publisher being told "duplicate" and nothing else.
    """
    return f"{thread_id}/{event_key}/{hashlib.sha256(data).hexdigest()[:16]}"


async def connect_nats(nats_url: str, *, name: str, **options: Any) -> NatsClient:
    """A connection for a long-running process: fail fast at start, then reconnect for ever.

    A wrong password or an unreachable server at start is a configuration error to report now
    (nats-py would otherwise retry for minutes); once connected, a broker restart or failover must
    never leave a worker alive but permanently disconnected.
    """
    nc = NatsClient()
    try:
        await nc.connect(nats_url, name=name, allow_reconnect=False, connect_timeout=5, **options)
    except Exception as exc:  # socket, TLS and protocol errors all mean: cannot start
        await _close_quietly(nc)  # nats-py leaves the failed socket open
        raise FleetUnavailable(f"cannot connect to NATS at {redact_url(nats_url)}: {exc}") from exc
    nc.options["allow_reconnect"] = True
    nc.options["max_reconnect_attempts"] = -1
    return nc


async def _close_quietly(nc: NatsClient) -> None:
    try:
        await nc.close()
    except Exception:  # already closed or never opened: nothing left to release
        pass
    transport = getattr(nc, "_transport", None)
    if transport is not None:
        transport.close()


class FleetClient:
    """A connection to the fleet over NATS."""

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=10.0)

    @classmethod
    async def connect(cls, nats_url: str, *, name: str = "ctxfleet-client", **options: Any) -> FleetClient:
        """Connect to the fleet's NATS server; ``options`` are ``nats.connect`` credentials and TLS."""
        try:
            nc = await nats.connect(nats_url, name=name, connect_timeout=5, max_reconnect_attempts=3, **options)
        except Exception as exc:  # nats-py raises a variety of socket and protocol errors here.
            raise FleetUnavailable(f"cannot connect to NATS at {redact_url(nats_url)}: {exc}") from exc
        return cls(nc)

    async def __aenter__(self) -> FleetClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Drain and close the connection."""
        if not self._nc.is_closed:
            await self._nc.drain()

    async def append(self, event: Event, *, timeout: float = 10.0) -> AppendAck:
        """Publish one event; returns once JetStream has stored it."""
        data = event.model_dump_json().encode()
        return await self.append_raw(event.thread_id, event.event_key, data, session_id=event.session_id, timeout=timeout)

    async def append_raw(
        self, thread_id: str, event_key: str, data: bytes, *, session_id: str | None = None, timeout: float = 10.0
    ) -> AppendAck:
        """Publish raw bytes as an event of ``thread_id`` (the fleet validates them).

        The session routes the event (one partition per session); when not given it is read from the
        body, and a body that says none is published under ``_`` to be dead-lettered.
        """
        session = session_id or _session_of(data)
        limit = self._nc.max_payload
        if len(data) > limit:
            raise PayloadTooLarge(len(data), limit)
        try:
            ack = await self._js.publish(
                events_subject(session, thread_id),
                data,
                stream=EVENTS_STREAM,
                timeout=timeout,
                headers={"Nats-Msg-Id": msg_id_of(thread_id, event_key, data)},
            )
        except MaxPayloadError as exc:
            raise PayloadTooLarge(len(data), limit) from exc
        except (NoRespondersError, NatsTimeout, ConnectionClosedError) as exc:
            raise FleetUnavailable(f"JetStream did not store the event: {type(exc).__name__}") from exc
        return AppendAck(stream_seq=ack.seq, duplicate=bool(ack.duplicate))

    async def prepare(self, request: PrepareRequest, *, timeout: float | None = None) -> PreparedContext:
        """The prepared context for the request's thread; raises the fleet's typed errors."""
        thread_id = f"{request.run_id}.{request.instance_id}"
        wait = timeout if timeout is not None else request.wait_ms / 1000 + 10.0
        body = await self._request(prepare_subject(thread_id), request.model_dump_json().encode(), wait)
        return PreparedContext.model_validate_json(body)

    async def inspect(self, thread_id: str, *, limit: int = 50, timeout: float = 10.0) -> ThreadInspection:
        """An operator's view of one thread."""
        body = await self._request(inspect_subject(thread_id), InspectRequest(limit=limit).model_dump_json().encode(), timeout)
        return ThreadInspection.model_validate_json(body)

    async def inspect_session(self, session_id: str, *, timeout: float = 10.0) -> SessionInspection:
        """An operator's view of a session: runs, threads, snapshots."""
        return SessionInspection.model_validate_json(await self._request(session_inspect_subject(session_id), b"{}", timeout))

    async def read(self, request: ReadRequest, *, timeout: float = 10.0) -> ReadReply:
        """A verified range of stored content (``ctx://blob/<sha256>``) of the request's session."""
        return ReadReply.model_validate_json(await self._request(READ, request.model_dump_json().encode(), timeout))

    async def register_policy(self, policy: ContextPolicy, *, timeout: float = 10.0) -> PolicyRegistered:
        """Register ``policy`` as the next revision of its name; new sessions naming it use it."""
        body = await self._request(POLICY_REGISTER, policy.model_dump_json().encode(), timeout)
        return PolicyRegistered.model_validate_json(body)

    async def search(self, request: SearchRequest, *, timeout: float = 10.0) -> SearchReply:
        """Full-text search within the request's session: pointers to read back, not evidence."""
        return SearchReply.model_validate_json(await self._request(SEARCH, request.model_dump_json().encode(), timeout))

    async def operation_status(self, request: OperationStatusRequest, *, timeout: float = 10.0) -> Receipt:
        """The receipt of an operation: ask before re-executing anything after a crash."""
        return Receipt.model_validate_json(await self._request(OPERATION_STATUS, request.model_dump_json().encode(), timeout))

    async def register_catalog(self, catalog: ToolCatalog, *, timeout: float = 10.0) -> CatalogRegistered:
        """Register a release's tool catalog (tools, declared reads and effects, state paths)."""
        body = await self._request(TOOLS_REGISTER, catalog.model_dump_json().encode(), timeout)
        return CatalogRegistered.model_validate_json(body)

    async def _request(self, subject: str, data: bytes, timeout: float) -> bytes:
        try:
            reply = await self._nc.request(subject, data, timeout=timeout)
        except NoRespondersError as exc:
            raise FleetUnavailable(f"no assembler is serving {subject}") from exc
        except NatsTimeout as exc:
            raise FleetUnavailable(f"no reply on {subject} within {timeout:.1f}s") from exc
        if _is_error(reply.data):
            raise error_from_reply(ErrorReply.model_validate_json(reply.data))
        return reply.data


def _session_of(data: bytes) -> str:
    try:
        value = json.loads(data).get("session_id")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return "_"
    return value if isinstance(value, str) and is_identifier(value) else "_"


def _is_error(data: bytes) -> bool:
    try:
        return bool(json.loads(data).get("type") == "error")
    except (ValueError, AttributeError) as exc:
        raise CtxError(f"unreadable reply from the fleet: {exc}") from exc
