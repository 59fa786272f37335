"""The AsyncAPI 3.0.0 document of the fleet, generated from ``contracts/``.

The document speaks for the fleet: it *receives* events and requests (and answers each request on
the requester's inbox), and *sends* dead letters and notices. Code generators for a runtime take
the opposite side. Every channel is one :class:`Channel` in :data:`CHANNELS`; adding a subject to
the fleet is adding one entry there (its messages then get schemas and components of their own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import metadata
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import TypeAdapter

from contracts import (
    COMPACTION_JOBS,
    OPERATION_STATUS,
    POLICY_REGISTER,
    READ,
    SEARCH,
    SESSION_INSPECT,
    CONTEXT_SHOW,
    ContextRequest,
    ContextShown,
    TOOLS_REGISTER,
    CatalogRegistered,
    Event,
    CompactedNotice,
    CompactionJob,
    ContextPolicy,
    DeadLetter,
    ErrorReply,
    InspectRequest,
    OperationStatusRequest,
    PolicyRegistered,
    PreparedContext,
    PrepareRequest,
    ReadReply,
    ReadRequest,
    Receipt,
    RecordedNotice,
    SearchReply,
    SearchRequest,
    SessionInspection,
    ThreadInspection,
    ToolCatalog,
)
from contracts.hook_protocol import HookCall, HookReply
from contracts.hooks import HOOKS, HOOKS_REGISTER, HookSet, HooksRegistered
from contracts.subjects import DEAD, EVENTS, INSPECT, PREPARE, RECORDED
from contracts.gateway import GATEWAY_CHECK, FinalCheck, FinalCheckRequest
from contracts.manage import COMPACT, CompactReply, CompactRequest
from contracts.branches import (
    SESSION_EXPORT,
    SESSION_FORK,
    ExportPage,
    ExportRequest,
    ForkRequest,
    SessionForked,
)
from services.settings import Settings

from .wire_schema import WireMessage, component_schemas

__all__ = ["CHANNELS", "Channel", "EVENT_MESSAGE", "asyncapi_document", "wire_messages"]

_SCHEMAS = "#/components/schemas/"

EVENT_MESSAGE = WireMessage(
    "Event",
    TypeAdapter(Event),
    "One event of a thread: an envelope (session, run, instance, event key) around the payload of its "
    "`kind`.",
)
# A request whose body the fleet ignores (session inspection sends `{}`).
_EMPTY = "EmptyRequest"

_PARAMETERS: Mapping[str, str] = {
    "tenant": "The tenant; the NATS server's permissions confine an identity to its own.",
    "session_id": "The session (letters, digits, `_` and `-`, 1-128).",
    "run_id": "The run: unique across every session of the fleet (a thread is `run_id.instance_id`).",
    "instance_id": "The agent instance within the run (`main`, or a child's id).",
    "hook": "The rest of a hook binding's subject: one to fourteen tokens (`policy`, `acme.redactor`).",
}
# Where a runtime finds each parameter's value in its own message, when it is there.
_LOCATIONS: Mapping[str, str] = {
    "session_id": "$message.payload#/session_id",
    "run_id": "$message.payload#/run_id",
    "instance_id": "$message.payload#/instance_id",
}

# NATS headers are strings. Each is documented in docs/wire.md.
_HEADERS: Mapping[str, Mapping[str, Any]] = {
    "EventHeaders": {
        "type": "object",
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "description": "`<run_id>.<instance_id>/<event_key>/<first 16 hex digits of sha256(body)>`, "
                "or absent.",
                "pattern": "^[A-Za-z0-9_-]{1,128}\\.[A-Za-z0-9_-]{1,128}/.+/[0-9a-f]{16}$",
            },
        },
    },
    "RequestHeaders": {
        "type": "object",
        "properties": {
            "ctx-deadline-ms": {
                "type": "string",
                "description": "Epoch milliseconds after which the caller no longer waits: the fleet drops "
                "the request unanswered if it gets no compute slot before then.",
                "pattern": "^[0-9]+$",
            },
        },
    },
    "ReplyHeaders": {
        "type": "object",
        "properties": {
            "ctx-status": {
                "type": "string",
                "enum": ["ok", "error"],
                "description": "`ok`: the body is the request's reply model; `error`: an ErrorReply.",
            },
        },
        "required": ["ctx-status"],
    },
}


@dataclass(frozen=True, slots=True)
class Channel:
    """One subject (pattern) of the fleet: what travels on it, who sends it, and what answers it."""

    key: str
    address: str
    action: Literal["receive", "send"]
    message: WireMessage | None
    description: str
    replies: tuple[WireMessage, ...] = ()
    headers: str | None = None
    # The fleet also takes the other side (its own workers consume what it sends).
    internal: bool = False
    # What the replies carry: the fleet's ``ctx-status``; none when another service answers the fleet.
    reply_headers: str | None = "ReplyHeaders"

    @property
    def message_name(self) -> str:
        return self.message.name if self.message else _EMPTY


def _request(key: str, subject: str, request: WireMessage | None, reply: type, description: str) -> Channel:
    return Channel(
        key,
        subject,
        "receive",
        request,
        description,
        replies=(WireMessage.of(reply, sent=True), WireMessage.of(ErrorReply, sent=True)),
        headers="RequestHeaders",
    )


_THREAD = "{run_id}.{instance_id}"

CHANNELS: tuple[Channel, ...] = (
    Channel(
        "events",
        f"{EVENTS}.{{tenant}}.{{session_id}}.{_THREAD}",
        "receive",
        EVENT_MESSAGE,
        "Runtimes publish every event of a thread here, into JetStream (stream CTX_EVENTS); the "
        "server's publish ack says it is stored. Bad events are dead-lettered, never answered.",
        headers="EventHeaders",
    ),
    _request(
        "prepare",
        f"{PREPARE}.{{tenant}}.{_THREAD}",
        WireMessage.of(PrepareRequest),
        PreparedContext,
        "The context of the thread's next model call, once the ledger holds `after_event_key`.",
    ),
    _request(
        "inspect",
        f"{INSPECT}.{{tenant}}.{_THREAD}",
        WireMessage.of(InspectRequest),
        ThreadInspection,
        "An operator's look at one thread: head, hash-chain check, latest records, refusals.",
    ),
    _request(
        "context_show",
        f"{CONTEXT_SHOW}.{{tenant}}.{_THREAD}",
        WireMessage.of(ContextRequest),
        ContextShown,
        "An operator's look at what the thread's next prepare would answer, and where its budget "
        "came from; nothing is written (a compaction or rollover it would start is only named).",
    ),
    _request(
        "session_inspect",
        f"{SESSION_INSPECT}.{{tenant}}.{{session_id}}",
        None,
        SessionInspection,
        "An operator's look at one session: runs, threads, snapshot boundaries (the body is ignored).",
    ),
    _request(
        "read",
        f"{READ}.{{tenant}}",
        WireMessage.of(ReadRequest),
        ReadReply,
        "A verified range of stored content of the request's session.",
    ),
    _request(
        "search",
        f"{SEARCH}.{{tenant}}",
        WireMessage.of(SearchRequest),
        SearchReply,
        "Full-text search within one session; hits are pointers to read back.",
    ),
    _request(
        "policy_register",
        f"{POLICY_REGISTER}.{{tenant}}",
        WireMessage.of(ContextPolicy),
        PolicyRegistered,
        "Register a context policy; each registration is a new revision.",
    ),
    _request(
        "tools_register",
        f"{TOOLS_REGISTER}.{{tenant}}",
        WireMessage.of(ToolCatalog),
        CatalogRegistered,
        "Register an agent release's tool catalog; each registration is a new revision.",
    ),
    _request(
        "hooks_register",
        f"{HOOKS_REGISTER}.{{tenant}}",
        WireMessage.of(HookSet),
        HooksRegistered,
        "Register an agent release's context hooks; each registration is a new revision.",
    ),
    _request(
        "operation_status",
        f"{OPERATION_STATUS}.{{tenant}}",
        WireMessage.of(OperationStatusRequest),
        Receipt,
        "What became of a side-effecting operation, before a recovering runtime re-executes it.",
    ),
    _request(
        "session_fork",
        f"{SESSION_FORK}.{{tenant}}",
        WireMessage.of(ForkRequest),
        SessionForked,
        "Start a session whose history is another's up to a seq, by reference (the original untouched).",
    ),
    _request(
        "session_export",
        f"{SESSION_EXPORT}.{{tenant}}.{{session_id}}",
        WireMessage.of(ExportRequest),
        ExportPage,
        "An operator's export of a session as a replayable trace, one page of JSONL lines per request.",
    ),
    _request(
        "compact",
        f"{COMPACT}.{{tenant}}.{_THREAD}",
        WireMessage.of(CompactRequest),
        CompactReply,
        "Compact the thread now (a manual `/compact`): the summary and the view's tokens before/after.",
    ),
    _request(
        "gateway_check",
        f"{GATEWAY_CHECK}.{{tenant}}.{_THREAD}",
        WireMessage.of(FinalCheckRequest),
        FinalCheck,
        "The model gateway's final check: the request about to be sent still holds every protected "
        "block, its additions are labelled and granted, and it fits.",
    ),
    Channel(
        "hooks",
        f"{HOOKS}.{{tenant}}.{{hook}}",
        "send",
        WireMessage.of(HookCall, sent=True),
        "The fleet calls a context hook of the session's release (`HookBinding.subject`) and waits its "
        "`timeout_ms` for the answer: continue, a patch of what the point allows, or a reject. A runtime "
        "or plugin service of the tenant answers; a late, missing or malformed answer is skipped or fails "
        "the stage by the binding's `failure` policy.",
        replies=(WireMessage.of(HookReply),),
        reply_headers=None,
    ),
    Channel(
        "dead_letters",
        f"{DEAD}.events.{_THREAD}",
        "send",
        WireMessage.of(DeadLetter, sent=True),
        "Every rejected event with its code, reason and raw payload (stream CTX_DEAD); `_._` stands "
        "for a thread that could not be read from the subject.",
    ),
    Channel(
        "recorded",
        f"{RECORDED}.{_THREAD}",
        "send",
        WireMessage.of(RecordedNotice, sent=True),
        "Core NATS hint: the thread's ledger moved. Waiters re-check the ledger; a lost one only delays.",
        internal=True,
    ),
    Channel(
        "compacted",
        f"ctx.compacted.{_THREAD}",
        "send",
        WireMessage.of(CompactedNotice, sent=True),
        "Core NATS hint: a compaction job of the thread ended.",
        internal=True,
    ),
    Channel(
        "compaction_jobs",
        COMPACTION_JOBS,
        "send",
        WireMessage.of(CompactionJob, sent=True),
        "Between the fleet's own workers (work-queue stream CTX_JOBS): one job to one compactor.",
        internal=True,
    ),
)


def _parameters_of(address: str) -> list[str]:
    return [token[1:-1] for token in address.split(".") if token.startswith("{")]


def wire_messages(channels: Iterable[Channel] = CHANNELS) -> list[WireMessage]:
    """Every message the channels carry, each once, in channel order."""
    seen: dict[str, WireMessage] = {}
    for channel in channels:
        for m in (channel.message, *channel.replies):
            if m is not None:
                seen.setdefault(m.name, m)
    return list(seen.values())


def _servers(settings: Settings) -> dict[str, Any]:
    """``fleet``: the configured server (the first of a cluster's); ``fleet-2``…: the cluster's others."""
    hint = "`ctxfleet env` prints the CTX_NATS_* lines a client needs."
    if not settings.bus.nats_url:
        where = "the embedded nats-server of `make run` (CTX_NATS_PORT)"
        return {
            "fleet": {
                "host": f"localhost:{settings.embedded.nats_port}",
                "protocol": "nats",
                "description": f"{where}; {hint}",
            }
        }
    servers: dict[str, Any] = {}
    count = len(settings.bus.nats_url)
    for i, url in enumerate(settings.bus.nats_url, start=1):
        # Host and port only: credentials in a URL are not the document's to publish.
        parts = urlsplit(url)
        where = (
            "the NATS server of CTX_NATS_URL"
            if count == 1
            else f"node {i} of {count} of CTX_NATS_URL's cluster"
        )
        servers["fleet" if i == 1 else f"fleet-{i}"] = {
            "host": f"{parts.hostname}:{parts.port or 4222}",
            "protocol": "nats",
            "description": f"{where}; {hint}",
        }
    return servers


def _message(name: str, description: str, headers: str | None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "name": name,
        "title": name,
        "contentType": "application/json",
        "payload": {"$ref": f"{_SCHEMAS}{name}"},
    }
    if description:
        message["summary"] = description.splitlines()[0]
    if headers is not None:
        message["headers"] = {"$ref": f"{_SCHEMAS}{headers}"}
    return message


def _channel(channel: Channel) -> dict[str, Any]:
    params = _parameters_of(channel.address)
    out: dict[str, Any] = {
        "address": channel.address,
        "description": channel.description,
        "messages": {channel.message_name: {"$ref": f"#/components/messages/{channel.message_name}"}},
    }
    if params:
        out["parameters"] = {
            p: {"description": _PARAMETERS[p], **({"location": _LOCATIONS[p]} if p in _LOCATIONS else {})}
            for p in params
        }
    return out


def _reply_channel(channel: Channel) -> dict[str, Any]:
    return {
        # The requester's inbox: NATS carries it in the request, not in a header or a fixed subject.
        "address": None,
        "description": f"The answer to a request on `{channel.address}`.",
        "messages": {r.name: {"$ref": f"#/components/messages/{r.name}"} for r in channel.replies},
    }


def _operations(channel: Channel) -> dict[str, Any]:
    ref = {"$ref": f"#/channels/{channel.key}"}
    op: dict[str, Any] = {
        "action": channel.action,
        "channel": ref,
        "summary": channel.description.split(". ")[0].rstrip("."),
        "messages": [{"$ref": f"#/channels/{channel.key}/messages/{channel.message_name}"}],
    }
    if channel.replies:
        reply_key = f"{channel.key}_reply"
        op["reply"] = {
            "channel": {"$ref": f"#/channels/{reply_key}"},
            "messages": [{"$ref": f"#/channels/{reply_key}/messages/{r.name}"} for r in channel.replies],
        }
    ops = {f"{channel.action}_{channel.key}": op}
    if channel.internal:
        ops[f"receive_{channel.key}"] = {
            **op,
            "action": "receive",
            "summary": f"Workers consume {channel.key}",
        }
    return ops


def asyncapi_document(settings: Settings, channels: Iterable[Channel] = CHANNELS) -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of ``channels``, its server taken from ``settings``."""
    listed = list(channels)
    meta = metadata("ctxfleet")
    schemas = component_schemas(wire_messages(listed), ref_template=f"{_SCHEMAS}{{model}}")
    schemas[_EMPTY] = {"type": "object", "description": "Any JSON object; the fleet ignores the body."}
    schemas.update({name: dict(h) for name, h in _HEADERS.items()})
    messages: dict[str, Any] = {}
    channel_docs: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    for channel in listed:
        if channel.message is not None:
            messages[channel.message.name] = _message(
                channel.message.name, channel.message.description, channel.headers
            )
        else:
            messages[_EMPTY] = _message(_EMPTY, "A request without a body of its own.", channel.headers)
        for r in channel.replies:
            messages[r.name] = _message(r.name, r.description, channel.reply_headers)
        channel_docs[channel.key] = _channel(channel)
        if channel.replies:
            channel_docs[f"{channel.key}_reply"] = _reply_channel(channel)
        operations.update(_operations(channel))
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": meta["Name"],
            "version": meta["Version"],
            "description": f"{meta['Summary']} Subjects, headers and errors: docs/wire.md.",
            "license": {"name": meta["License"]},
        },
        "defaultContentType": "application/json",
        "servers": _servers(settings),
        "channels": channel_docs,
        "operations": operations,
        "components": {"schemas": schemas, "messages": messages},
    }
