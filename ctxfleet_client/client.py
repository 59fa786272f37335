"""The fleet's client: publish events, prepare contexts, read back, search, compact, export and fork.

``append`` publishes an event to JetStream with ``Nats-Msg-Id`` = thread + event key, so a retried
publish is dropped by the server within its window and by the recorder after it. ``prepare``
asks the assembler (request/reply) and raises the typed error of an error reply. ``append_and_prepare``
is one agent step: both at once, the prepare naming the event.

A prepare naming an event this client published carries the event's content hash
(``after_event_hash``), so a key reused for another body is answered ``event_rejected`` at once.

A client speaks for one tenant (``tenant``, ``default`` unless told): every subject it uses names it,
and the NATS server's permissions decide whether this identity may. Replies come back on inboxes
under ``_INBOX.<user>``, the only inboxes a runtime identity may subscribe to, so no other client
can read them.

Every request carries the caller's deadline (``ctx-deadline-ms``, epoch milliseconds), so an
assembler never computes an answer nobody waits for. While the connection is down the client keeps
reconnecting, and requests fail at once with ``FleetUnavailable`` instead of hanging until timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient
from nats.errors import (
    ConnectionClosedError,
    ConnectionDrainingError,
    ConnectionReconnectingError,
    MaxPayloadError,
    NoRespondersError,
    OutboundBufferLimitError,
)
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError

from pydantic import JsonValue

from contracts import (
    CompactReply,
    CompactRequest,
    FinalCheck,
    FinalCheckRequest,
    GatewayAddition,
    gateway_check_subject,
    compact_subject,
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
    EventDecodeError,
    InspectRequest,
    PolicyRegistered,
    PreparedContext,
    PrepareRequest,
    ReadReply,
    ReadRequest,
    SessionInspection,
    ThreadInspection,
    decode_event,
    session_inspect_subject,
    context_show_subject,
    ContextRequest,
    ContextShown,
)
from contracts.branches import (
    SESSION_FORK,
    ExportPage,
    ExportRequest,
    ForkRequest,
    SessionForked,
    session_export_subject,
)
from contracts.hooks import HOOKS_REGISTER, HookSet, HooksRegistered
from contracts.identities import inbox_prefix
from contracts.ids import is_identifier
from contracts.subjects import (
    DEFAULT_TENANT,
    EVENTS_STREAM,
    check_subject,
    check_tenant,
    events_subject,
    inspect_subject,
    msg_id_of,
    prepare_subject,
    tenant_subject,
)

from contracts.events import content_sha256
from contracts.exceptions import (
    CtxError,
    FleetUnavailable,
    InvalidConfiguration,
    InvalidRequest,
    PayloadTooLarge,
    PermissionDenied,
    error_from_reply,
)

from .connection import FleetAddress, nats_connection, redact_url

__all__ = [
    "DEADLINE_HEADER",
    "STATUS_HEADER",
    "AppendAck",
    "FleetClient",
    "StepReply",
    "connect_nats",
    "inbox_prefix",
    "log_nats_error",
    "msg_id_of",
]

_log = logging.getLogger("ctxfleet.nats")

# OpenTelemetry is the runtime's choice, not a dependency of the client: its context is propagated
# when the runtime has it installed.
_inject_trace_context: Callable[[dict[str, str]], None] | None
try:
    from opentelemetry.propagate import inject as _inject_trace_context
except ImportError:
    _inject_trace_context = None

# The request header with the caller's deadline (epoch ms); assemblers drop a request past it.
DEADLINE_HEADER = "ctx-deadline-ms"
# The label of every reply the fleet sends: "ok" or "error" (an ErrorReply body).
STATUS_HEADER = "ctx-status"
# How long a publish waits for JetStream's ack.
_PUBLISH_TIMEOUT_S = 10.0
# How many published events' content hashes a client keeps for the prepares naming them: a runtime
# names its latest event, or one of its last few when it retries.
_REMEMBERED_EVENTS = 1024
# Errors of a connection that is down (reconnecting, draining, closed): the fleet is unreachable.
_DISCONNECTED = (
    ConnectionClosedError,
    ConnectionReconnectingError,
    ConnectionDrainingError,
    OutboundBufferLimitError,
)


@dataclass(frozen=True, slots=True)
class AppendAck:
    """Where JetStream stored an event, and whether it was a duplicate publish."""

    stream_seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class StepReply:
    """One step's outcome: where its event was stored, and the prepared context that includes it."""

    ack: AppendAck
    prepared: PreparedContext


async def connect_nats(
    servers: str | Sequence[str],
    *,
    name: str,
    max_reconnect_attempts: int = -1,
    reconnect_wait_s: float | None = 0.5,
    **options: Any,
) -> NatsClient:
    """A connection for a long-running process: fail fast at start, then reconnect for ever.

    A wrong password or an unreachable server at start is a configuration error to report now
    (nats-py would otherwise retry for minutes); once connected, a broker restart or failover must
    never leave a worker alive but permanently disconnected. ``max_reconnect_attempts`` (per
    server, -1: no limit) and ``reconnect_wait_s`` (between attempts) apply after the first connect.
    ``servers`` is one URL, a cluster's comma-separated, or a sequence of them; credentials in any of
    them are used for every server (``ctxfleet_client.connection.nats_connection``).
    """
    try:
        urls, options = nats_connection(servers, options)
    except ValueError as exc:
        raise InvalidConfiguration([f"NATS servers: {exc}"]) from None
    options.setdefault("error_cb", log_nats_error)
    nc = NatsClient()
    try:
        # nats-py retries a refused first connect up to max_reconnect_attempts (60) times, 2 s apart,
        # even with allow_reconnect off: two quick tries per server, then the error.
        await nc.connect(
            urls,
            name=name,
            allow_reconnect=False,
            connect_timeout=5,
            max_reconnect_attempts=1,
            reconnect_time_wait=0.1,  # type: ignore[arg-type]  # typed int, used as seconds
            **options,
        )
    except Exception as exc:  # socket, TLS and protocol errors all mean: cannot start
        await _close_quietly(nc)
        shown = ", ".join(map(redact_url, urls))
        raise FleetUnavailable(f"cannot connect to NATS at {shown}: {exc}") from exc
    nc.options["allow_reconnect"] = True
    nc.options["max_reconnect_attempts"] = max_reconnect_attempts
    if reconnect_wait_s is not None:
        nc.options["reconnect_time_wait"] = reconnect_wait_s
    return nc


async def log_nats_error(exc: Exception) -> None:
    """One line per error of a connection (nats-py's default logs each with a traceback): a refused
    or dropped server is expected while a node of a cluster is down, and the connection moves on."""
    _log.warning("NATS: %s: %s", type(exc).__name__, exc)


async def _close_quietly(nc: NatsClient) -> None:
    try:
        await nc.close()
    except Exception:  # already closed or never opened: nothing left to release
        pass


class FleetClient:
    """A connection to the fleet over NATS, speaking for one tenant."""

    def __init__(
        self, nc: NatsClient, denials: _Denials | None = None, *, tenant: str = DEFAULT_TENANT
    ) -> None:
        self.tenant = check_tenant(tenant)
        self._nc = nc
        self._js: JetStreamContext = nc.jetstream(timeout=10.0)
        self._denials = denials or _Denials()
        # (thread, event key) → content hash of the body this client published last under that key.
        self._published: OrderedDict[tuple[str, str], str] = OrderedDict()

    @classmethod
    async def connect(
        cls,
        servers: str | Sequence[str],
        *,
        name: str = "ctxfleet-client",
        tenant: str = DEFAULT_TENANT,
        max_reconnect_attempts: int = -1,
        reconnect_wait_s: float = 0.5,
        **options: Any,
    ) -> FleetClient:
        """Connect to the fleet's NATS server; ``options`` are ``nats.connect`` credentials and TLS.

        Args:
            servers: The server's URL, or a cluster's: comma-separated or as a sequence. Credentials in
                any of them (``nats://user:password@host``) are used for every server.
            name: The connection name the server shows.
            tenant: The tenant this client speaks for; the server refuses it another tenant's subjects.
            max_reconnect_attempts: Reconnect attempts per server after a lost connection; -1 (the
                default) reconnects for as long as the client lives.
            reconnect_wait_s: Pause between attempts on one server.
            options: Credentials and TLS, as ``nats.connect`` takes them.

        Raises:
            FleetUnavailable: the first connection failed (at once: a wrong URL or password is not
                retried, only a connection that was up and dropped).
            InvalidConfiguration: ``servers`` are not nats:// URLs (``connection.parse_nats_urls``).
        """
        denials = _Denials(options.pop("error_cb", None))
        try:
            urls, options = nats_connection(servers, options)
        except ValueError as exc:
            raise InvalidConfiguration([f"NATS servers: {exc}"]) from None
        options.setdefault("inbox_prefix", inbox_prefix(options.get("user")))
        nc = await connect_nats(
            urls,
            name=name,
            max_reconnect_attempts=max_reconnect_attempts,
            reconnect_wait_s=reconnect_wait_s,
            error_cb=denials.on_error,
            **options,
        )
        return cls(nc, denials, tenant=tenant)

    @classmethod
    async def from_env(
        cls, environ: Mapping[str, str] | None = None, *, name: str = "ctxfleet-client", **options: Any
    ) -> FleetClient:
        """Connect as the lines ``ctxfleet env`` printed say (``eval "$(ctxfleet env)"``).

        Reads ``CTX_NATS_URL`` (one URL, or a cluster's comma-separated), ``CTX_NATS_USER``,
        ``CTX_NATS_PASSWORD`` and ``CTX_TENANT`` from ``environ`` (default ``os.environ``);
        ``options`` are passed to :meth:`connect`.

        Raises:
            InvalidConfiguration: a variable is missing or malformed.
            FleetUnavailable: the first connection failed.
        """
        try:
            address = FleetAddress.from_env(environ)
        except ValueError as exc:
            raise InvalidConfiguration([str(exc)]) from None
        return await cls.connect(
            address.servers, name=name, tenant=address.tenant, **(address.options() | options)
        )

    async def __aenter__(self) -> FleetClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Drain and close the connection (just close it while it is down: nothing can drain)."""
        if self._nc.is_closed:
            return
        if self._nc.is_connected:
            await self._nc.drain()
        else:
            await self._nc.close()

    async def append(self, event: Event, *, timeout: float = _PUBLISH_TIMEOUT_S) -> AppendAck:
        """Publish one event; returns once JetStream has stored it."""
        data = event.model_dump_json().encode()
        self._remember(data)
        return await self._publish(event.thread_id, event.event_key, data, event.session_id, timeout)

    def _remember(self, data: bytes) -> str | None:
        """Keep the content hash of a body about to be published under its thread and key (the one the
        recorder will compute: the bytes decoded as it decodes them); ``None`` for a body it refuses."""
        if len(data) > self._nc.max_payload:
            return None  # never published: refused before it leaves
        try:
            event = decode_event(data, max_bytes=len(data))
        except EventDecodeError:
            return None
        sha = content_sha256(event)
        key = (event.thread_id, event.event_key)
        self._published[key] = sha
        self._published.move_to_end(key)
        while len(self._published) > _REMEMBERED_EVENTS:
            self._published.popitem(last=False)
        return sha

    async def append_raw(
        self,
        thread_id: str,
        event_key: str,
        data: bytes,
        *,
        session_id: str | None = None,
        timeout: float = 10.0,
    ) -> AppendAck:
        """Publish raw bytes as an event of ``thread_id`` (the fleet validates them).

        The session routes the event (one partition per session); when not given it is read from the
        body, and a body that says none is published under ``_`` to be dead-lettered. The
        ``Nats-Msg-Id`` is derived from the body's own event key where it names one (the recorder
        checks that), ``event_key`` otherwise.
        """
        body_session, body_key = _envelope_of(data)
        self._remember(data)
        return await self._publish(
            thread_id, body_key or event_key, data, session_id or body_session, timeout
        )

    async def _publish(
        self, thread_id: str, event_key: str, data: bytes, session: str, timeout: float
    ) -> AppendAck:
        limit = self._nc.max_payload
        if len(data) > limit:
            raise PayloadTooLarge(len(data), limit)
        self._ensure_connected(f"cannot append to {thread_id}")
        subject = _subject(events_subject, self.tenant, session, thread_id)
        try:
            ack = await self._denials.guard(
                subject,
                self._js.publish(
                    subject,
                    data,
                    stream=EVENTS_STREAM,
                    timeout=timeout,
                    headers={"Nats-Msg-Id": msg_id_of(thread_id, event_key, data)},
                ),
            )
        except MaxPayloadError as exc:
            raise PayloadTooLarge(len(data), limit) from exc
        # NoStreamResponseError: the stream answered 503, as it does while its replicas elect a leader.
        except (NoRespondersError, NoStreamResponseError, NatsTimeout, *_DISCONNECTED) as exc:
            raise FleetUnavailable(f"JetStream did not store the event: {type(exc).__name__}") from exc
        except APIError as exc:
            # "insufficient resources" (503) when its store is full: nothing stored, retry later.
            raise FleetUnavailable(
                f"JetStream did not store the event: {exc.description or 'refused'} ({exc.code})"
            ) from exc
        return AppendAck(stream_seq=ack.seq, duplicate=bool(ack.duplicate))

    async def prepare(self, request: PrepareRequest, *, timeout: float | None = None) -> PreparedContext:
        """The prepared context for the request's thread; raises the fleet's typed errors."""
        thread_id = f"{request.run_id}.{request.instance_id}"
        wait = timeout if timeout is not None else request.wait_ms / 1000 + 10.0
        if request.after_event_key is not None and request.after_event_hash is None:
            published = self._published.get((thread_id, request.after_event_key))
            if published is not None:
                request = request.model_copy(update={"after_event_hash": published})
        body = await self._request(
            _subject(prepare_subject, self.tenant, thread_id), request.model_dump_json().encode(), wait
        )
        return PreparedContext.model_validate_json(body)

    async def append_and_prepare(
        self, event: Event, request: PrepareRequest, *, timeout: float | None = None
    ) -> StepReply:
        """One agent step: publish ``event`` and get the prepared context that includes it.

        The prepare names the event (``after_event_key``) and is sent with the publish, not after its
        ack: the assembler waits for the event to be recorded either way (read-your-writes). Next to
        the fleet that is about as fast as sequential, since the recorder's write outlasts the ack's
        way back; a runtime far from the broker saves a round trip (5 ms away each
        way: 16.9 against 25.2 ms p50). ``request`` must be for the event's thread and session and
        name no other event.

        A failed publish wins: its error is raised and the prepare abandoned (its own error would only
        be ``not_yet_recorded`` once ``wait_ms`` ran out). A failed prepare is raised once the publish
        has been answered. Either way the whole step can be retried with the same event: the server
        drops the second publish as a duplicate, and the prepare is read-only.
        """
        _check_step(event, request)
        data = event.model_dump_json().encode()
        named = request.model_copy(
            update={"after_event_key": event.event_key, "after_event_hash": self._remember(data)}
        )
        publish = asyncio.ensure_future(
            self._publish(event.thread_id, event.event_key, data, event.session_id, _PUBLISH_TIMEOUT_S)
        )
        prepare = asyncio.ensure_future(self.prepare(named, timeout=timeout))
        try:
            await asyncio.wait((publish, prepare), return_when=asyncio.FIRST_EXCEPTION)
            if publish.done() and publish.exception() is not None:
                prepare.cancel()
                await asyncio.wait((prepare,))
            ack = await publish
            return StepReply(ack=ack, prepared=await prepare)
        finally:
            for task in (publish, prepare):
                if not task.done():
                    task.cancel()
            # Retrieved, so an abandoned half's error is not reported as never retrieved.
            for task in (publish, prepare):
                if task.done() and not task.cancelled():
                    task.exception()

    async def inspect(self, thread_id: str, *, limit: int = 50, timeout: float = 10.0) -> ThreadInspection:
        """An operator's view of one thread."""
        request = InspectRequest(limit=limit).model_dump_json().encode()
        body = await self._request(_subject(inspect_subject, self.tenant, thread_id), request, timeout)
        return ThreadInspection.model_validate_json(body)

    async def show_context(
        self, thread_id: str, request: ContextRequest | None = None, *, timeout: float = 30.0
    ) -> ContextShown:
        """What the thread's next prepare would answer, prepared by nothing (an operator's look)."""
        body = (request or ContextRequest()).model_dump_json().encode()
        reply = await self._request(_subject(context_show_subject, self.tenant, thread_id), body, timeout)
        return ContextShown.model_validate_json(reply)

    async def inspect_session(self, session_id: str, *, timeout: float = 10.0) -> SessionInspection:
        """An operator's view of a session: runs, threads, snapshots."""
        subject = _subject(session_inspect_subject, self.tenant, session_id)
        return SessionInspection.model_validate_json(await self._request(subject, b"{}", timeout))

    async def fork_session(self, request: ForkRequest, *, timeout: float = 10.0) -> SessionForked:
        """Start ``request.new_session_id`` from a session's history up to ``request.at_seq`` (by
        reference: the parent is never changed). Asking again for the same fork answers it again."""
        body = await self._request(self._of_tenant(SESSION_FORK), request.model_dump_json().encode(), timeout)
        return SessionForked.model_validate_json(body)

    async def export_page(
        self, session_id: str, request: ExportRequest, *, timeout: float = 10.0
    ) -> ExportPage:
        """One page of a session exported as a trace (operators)."""
        subject = _subject(session_export_subject, self.tenant, session_id)
        return ExportPage.model_validate_json(
            await self._request(subject, request.model_dump_json().encode(), timeout)
        )

    async def export_session(self, session_id: str, *, timeout: float = 10.0) -> AsyncIterator[str]:
        """A session as trace text (JSONL), chunk by chunk, every page asked for in turn."""
        request: ExportRequest | None = ExportRequest()
        while request is not None:
            page = await self.export_page(session_id, request, timeout=timeout)
            if page.chunk:
                yield page.chunk
            request = (
                None
                if page.next_after_seq is None
                else ExportRequest(after_seq=page.next_after_seq, offset=page.next_offset)
            )

    async def compact(self, request: CompactRequest, *, timeout: float = 120.0) -> CompactReply:
        """Compact the request's thread now (``/compact``); the summary and the view's tokens before/after.

        The default timeout leaves room for a summarizer that calls a model. Raises
        ``NothingToCompact``, ``CompactionFailed`` or ``ThreadNotFound`` (another tenant's thread too).
        """
        subject = _subject(compact_subject, self.tenant, f"{request.run_id}.{request.instance_id}")
        body = await self._request(subject, request.model_dump_json().encode(), timeout)
        return CompactReply.model_validate_json(body)

    async def check_final(
        self,
        prepared: PreparedContext,
        request: Mapping[str, JsonValue],
        additions: Sequence[GatewayAddition] = (),
        *,
        attempt: int = 1,
        timeout: float = 10.0,
    ) -> FinalCheck:
        """Hold the provider ``request`` about to be sent to the context it was ``prepared`` from.

        Answers ``ok`` or, once, ``context_reprepare_required`` (prepare again with
        ``carry_additions_from=check.check_id``). Raises ``ProtectedBlockAltered``,
        ``AdditionRefused`` or ``ContextBudgetExceeded`` for a request that must not be sent, and
        ``PreparedContextNotFound`` for a context the fleet does not know.
        """
        body = FinalCheckRequest(
            run_id=prepared.run_id,
            instance_id=prepared.instance_id,
            prepared_id=prepared.prepared_id,
            attempt=attempt,
            format=prepared.format,
            request=dict(request),
            additions=tuple(additions),
        )
        subject = _subject(gateway_check_subject, self.tenant, f"{prepared.run_id}.{prepared.instance_id}")
        return FinalCheck.model_validate_json(
            await self._request(subject, body.model_dump_json().encode(), timeout)
        )

    async def read(self, request: ReadRequest, *, timeout: float = 10.0) -> ReadReply:
        """A verified range of stored content (``ctx://blob/<sha256>``) of the request's session."""
        return ReadReply.model_validate_json(
            await self._request(self._of_tenant(READ), request.model_dump_json().encode(), timeout)
        )

    async def register_policy(self, policy: ContextPolicy, *, timeout: float = 10.0) -> PolicyRegistered:
        """Register ``policy`` as the next revision of its name; new sessions naming it use it."""
        body = await self._request(
            self._of_tenant(POLICY_REGISTER), policy.model_dump_json().encode(), timeout
        )
        return PolicyRegistered.model_validate_json(body)

    async def search(self, request: SearchRequest, *, timeout: float = 10.0) -> SearchReply:
        """Full-text search within the request's session: pointers to read back, not evidence."""
        body = await self._request(self._of_tenant(SEARCH), request.model_dump_json().encode(), timeout)
        return SearchReply.model_validate_json(body)

    async def operation_status(self, request: OperationStatusRequest, *, timeout: float = 10.0) -> Receipt:
        """The receipt of an operation: ask before re-executing anything after a crash."""
        body = await self._request(
            self._of_tenant(OPERATION_STATUS), request.model_dump_json().encode(), timeout
        )
        return Receipt.model_validate_json(body)

    async def register_catalog(self, catalog: ToolCatalog, *, timeout: float = 10.0) -> CatalogRegistered:
        """Register a release's tool catalog (tools, declared reads and effects, state paths)."""
        body = await self._request(
            self._of_tenant(TOOLS_REGISTER), catalog.model_dump_json().encode(), timeout
        )
        return CatalogRegistered.model_validate_json(body)

    async def register_hooks(self, hooks: HookSet, *, timeout: float = 10.0) -> HooksRegistered:
        """Register a release's context hooks; sessions of the release created afterwards use them."""
        body = await self._request(self._of_tenant(HOOKS_REGISTER), hooks.model_dump_json().encode(), timeout)
        return HooksRegistered.model_validate_json(body)

    def _of_tenant(self, base: str) -> str:
        return tenant_subject(base, self.tenant)

    def _ensure_connected(self, what: str) -> None:
        # nats-py would buffer the publish and let the caller wait out its whole timeout.
        if not self._nc.is_connected:
            state = "closed" if self._nc.is_closed else "reconnecting"
            raise FleetUnavailable(f"{what}: the NATS connection is {state}")

    async def _request(self, subject: str, data: bytes, timeout: float) -> bytes:
        self._ensure_connected(f"cannot request {subject}")
        deadline = int(time.time() * 1000 + timeout * 1000)
        headers = {DEADLINE_HEADER: str(deadline)}
        if _inject_trace_context is not None:
            # The runtime's current span, if it traces with OpenTelemetry: the fleet's spans continue it.
            _inject_trace_context(headers)
        try:
            reply = await self._denials.guard(
                subject, self._nc.request(subject, data, timeout=timeout, headers=headers)
            )
        except NoRespondersError as exc:
            raise FleetUnavailable(f"no fleet worker is serving {subject}") from exc
        except _DISCONNECTED as exc:
            raise FleetUnavailable(
                f"the NATS connection dropped during {subject}: {type(exc).__name__}"
            ) from exc
        except NatsTimeout as exc:
            raise FleetUnavailable(f"no reply on {subject} within {timeout:.1f}s") from exc
        if _is_error(reply.data, reply.headers):
            raise error_from_reply(ErrorReply.model_validate_json(reply.data))
        return reply.data


_DENIED = re.compile(r'permissions violation for publish to "(?P<subject>[^"]+)"', re.IGNORECASE)
_T = TypeVar("_T")


class _Denials:
    """Fails a publish or request at once when the broker refuses this identity its subject.

    The server reports a permissions violation asynchronously (an ``-ERR`` to the connection's
    error callback), and the message is simply not delivered: without this a request would wait
    out its whole timeout and end as ``fleet_unavailable``, which a runtime would retry.
    """

    def __init__(self, chained: Callable[[Exception], Awaitable[None]] | None = None) -> None:
        self._chained = chained
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}

    async def on_error(self, exc: Exception) -> None:
        found = _DENIED.search(str(exc))
        if found is not None:
            for waiter in self._waiting.get(found["subject"], ()):
                if not waiter.done():
                    waiter.set_exception(PermissionDenied(found["subject"]))
        if self._chained is not None:
            await self._chained(exc)

    async def guard(self, subject: str, work: Awaitable[_T]) -> _T:
        """``work``'s result, or ``PermissionDenied`` as soon as the broker refuses ``subject``."""
        denied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(subject, []).append(denied)
        task = asyncio.ensure_future(work)
        either: list[asyncio.Future[Any]] = [task, denied]
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)  # never wait unboundedly on a cancelled task
                denied.result()  # raises PermissionDenied
            return task.result()
        finally:
            waiters = self._waiting.get(subject, [])
            if denied in waiters:
                waiters.remove(denied)
            if not waiters:
                self._waiting.pop(subject, None)
            if not denied.done():
                denied.cancel()
            elif not denied.cancelled():
                denied.exception()  # retrieved: a denial that lost the race is not an unhandled error


def _check_step(event: Event, request: PrepareRequest) -> None:
    """A step's prepare must be for its event's thread and session, and name that event or none."""
    asked = (request.session_id, request.run_id, request.instance_id)
    recorded = (event.session_id, event.run_id, event.instance_id)
    if asked != recorded:
        raise InvalidRequest(
            "a step's prepare must be for its event's session and thread",
            event=".".join(recorded),
            request=".".join(asked),
        )
    if request.after_event_key not in (None, event.event_key):
        raise InvalidRequest(
            "a step's prepare names the step's own event",
            event_key=event.event_key,
            after_event_key=request.after_event_key,
        )


def _subject(build: Callable[..., str], *tokens: str) -> str:
    """The subject ``build`` makes of ``tokens``; an id that cannot be a subject token (too long, a
    dot, a wildcard) is an ``InvalidRequest`` at once, before anything is sent (``contracts.subjects``)."""
    try:
        return check_subject(build(*tokens))
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None


def _envelope_of(data: bytes) -> tuple[str, str | None]:
    """The session (``_`` if none) and event key (if any) a raw body names."""
    try:
        body = json.loads(data)
        session, key = body.get("session_id"), body.get("event_key")
    except (ValueError, AttributeError, UnicodeDecodeError, RecursionError):
        return "_", None
    return (
        session if isinstance(session, str) and is_identifier(session) else "_",
        key if isinstance(key, str) else None,
    )


def _is_error(data: bytes, headers: dict[str, str] | None = None) -> bool:
    # The fleet labels every reply (``ctx-status``): reading the label spares parsing a large context
    # twice (here, then into its model) on the hot path. Unlabelled replies are parsed to tell.
    status = (headers or {}).get(STATUS_HEADER)
    if status is not None:
        return status == "error"
    try:
        return bool(json.loads(data).get("type") == "error")
    except (ValueError, AttributeError) as exc:
        raise CtxError(f"unreadable reply from the fleet: {exc}") from exc
