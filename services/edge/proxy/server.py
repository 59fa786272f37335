"""The proxy's HTTP side: a Starlette app that puts the fleet between an SDK and its provider.

One request: read the conversation, publish what is new as events, prepare the thread's context in
the provider's shape, send it upstream with the caller's credentials, record the answer, and hand
the provider's response back unchanged (streamed as it arrives). The caller's credentials are
forwarded on the upstream request only: never stored, logged or sent to the fleet.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, assert_never

import httpx2
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from contracts import (
    AssistantMessageEvent,
    AssistantMessagePayload,
    PrepareRequest,
    ReportedUsage,
    SystemEvent,
    SystemPayload,
    ToolOutcomeEvent,
    ToolOutcomePayload,
    UserInputEvent,
    UserInputPayload,
)
from contracts.prepare import ProviderOverflow
from contracts.exceptions import CtxError, InvalidRequest, ProviderContextExceeded

from .answers import Answer, StreamAnswer, read_answer, read_overflow
from .reading import read_request
from .shapes import Conversation, Family, Item, ThreadRef, find_thread, profile_of, upstream_body

if TYPE_CHECKING:
    from starlette.requests import Request

    from contracts import Event, PreparedContext
    from ctxfleet_client import FleetClient

__all__ = ["ProxyConfig", "build_app"]

log = logging.getLogger("ctxfleet.proxy")

# Sent upstream as the caller sent them; every other header stays here.
_FORWARDED = (
    "authorization",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "openai-organization",
    "openai-project",
    "openai-beta",
)
# What a response body no longer is once httpx decoded it, or what Starlette sets itself.
_NOT_RETURNED = frozenset({"content-length", "content-encoding", "transfer-encoding", "connection"})
# Threads whose published keys and last usage report are remembered: a bound, not a cache size to tune.
_REMEMBERED_THREADS = 10_000


@dataclass(frozen=True)
class ProxyConfig:
    """Where the providers are, and the budget of a model the fleet has no profile for."""

    openai_url: str = "https://api.openai.com/v1"
    anthropic_url: str = "https://api.anthropic.com"
    # Caps every prepare (or budgets a model without a built-in profile).
    budget_tokens: int | None = None
    timeout_s: float = 600.0


@dataclass
class _Memory:
    """Per thread: the keys this process published (so a long conversation is not republished on
    every request) and the usage of its last answer (reported on the thread's next prepare, where it
    calibrates the fleet's counts). Losing it costs one republish of duplicates or one usage report."""

    published: OrderedDict[str, set[str]] = field(default_factory=OrderedDict)
    usage: dict[str, ReportedUsage] = field(default_factory=dict)

    def keys(self, thread: str) -> set[str]:
        keys = self.published.setdefault(thread, set())
        self.published.move_to_end(thread)
        while len(self.published) > _REMEMBERED_THREADS:
            evicted, _ = self.published.popitem(last=False)
            self.usage.pop(evicted, None)
        return keys


def build_app(client: FleetClient, http: httpx2.AsyncClient, config: ProxyConfig) -> Starlette:
    """The proxy as an ASGI app; ``client`` and ``http`` are the caller's to open and close."""
    proxy = _Proxy(client, http, config, _Memory())
    return Starlette(
        routes=[
            Route("/v1/chat/completions", proxy.endpoint(Family.CHAT), methods=["POST"]),
            Route("/v1/responses", proxy.endpoint(Family.RESPONSES), methods=["POST"]),
            Route("/v1/messages", proxy.endpoint(Family.MESSAGES), methods=["POST"]),
        ]
    )


@dataclass(frozen=True)
class _Step:
    """One request on its way: the caller's body, its conversation and thread, the context sent."""

    family: Family
    body: dict[str, Any]
    conversation: Conversation
    thread: ThreadRef
    headers: dict[str, str]
    prepared: PreparedContext


class _Proxy:
    def __init__(
        self, client: FleetClient, http: httpx2.AsyncClient, config: ProxyConfig, memory: _Memory
    ) -> None:
        self.client, self.http, self.config, self.memory = client, http, config, memory

    def endpoint(self, family: Family) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            try:
                return await self.handle(family, request)
            except CtxError as exc:
                return _error_response(family, exc)

        return handle

    async def handle(self, family: Family, request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise InvalidRequest("the request body is not JSON", field="body") from None
        conversation = read_request(family, body)
        thread = find_thread(request.headers, conversation)
        last = await self._publish(thread, conversation.items)
        prepared = await self._prepare(family, conversation, thread, last, None)
        headers = {k: v for k in _FORWARDED if (v := request.headers.get(k)) is not None}
        step = _Step(family, body, conversation, thread, headers, prepared)
        if conversation.stream:
            return await self._stream(step, retried=False)
        return await self._call(step, retried=False)

    async def _publish(self, thread: ThreadRef, items: tuple[Item, ...]) -> str:
        """Publish the items this process has not yet published, in order; the last item's key."""
        thread_id = f"{thread.run_id}.{thread.instance_id}"
        known = self.memory.keys(thread_id)
        for item in items:
            if item.event_key not in known:
                # In order, one at a time: the ledger's order is the conversation's.
                await self.client.append(_event(thread, item))
                known.add(item.event_key)
        return items[-1].event_key

    async def _prepare(
        self,
        family: Family,
        conversation: Conversation,
        thread: ThreadRef,
        last: str,
        overflow: ProviderOverflow | None,
    ) -> PreparedContext:
        profile = profile_of(conversation.model)
        if profile is None and self.config.budget_tokens is None:
            raise InvalidRequest(
                f"model {conversation.model!r} has no built-in profile; start the proxy with --budget-tokens",
                model=conversation.model,
            )
        usage = self.memory.usage.pop(f"{thread.run_id}.{thread.instance_id}", None)
        return await self.client.prepare(
            PrepareRequest(
                session_id=thread.session_id,
                run_id=thread.run_id,
                instance_id=thread.instance_id,
                model_profile=profile,
                budget_tokens=self.config.budget_tokens,
                tools=conversation.tools,
                format=family.request_format,
                after_event_key=last,
                usage=usage,
                after_overflow=overflow,
            )
        )

    def _url(self, family: Family) -> str:
        match family:
            case Family.CHAT:
                return f"{self.config.openai_url}/chat/completions"
            case Family.RESPONSES:
                return f"{self.config.openai_url}/responses"
            case Family.MESSAGES:
                return f"{self.config.anthropic_url}/v1/messages"

    def _upstream(self, step: _Step) -> httpx2.Request:
        return self.http.build_request(
            "POST",
            self._url(step.family),
            json=upstream_body(
                step.family, step.body, step.prepared, answer_position=step.conversation.answer_position
            ),
            headers=step.headers,
            timeout=self.config.timeout_s,
        )

    async def _call(self, step: _Step, *, retried: bool) -> Response:
        upstream = await self.http.send(self._upstream(step))
        if upstream.is_success:
            await self._record(step, read_answer(step.family, upstream.json()))
            return _passed(step, upstream, upstream.content)
        again = await self._after_error(step, upstream, retried)
        return await self._call(again, retried=True) if again else _passed(step, upstream, upstream.content)

    async def _stream(self, step: _Step, *, retried: bool) -> Response:
        upstream = await self.http.send(self._upstream(step), stream=True)
        if not upstream.is_success:
            await upstream.aread()
            await upstream.aclose()
            again = await self._after_error(step, upstream, retried)
            return (
                await self._stream(again, retried=True)
                if again
                else _passed(step, upstream, upstream.content)
            )

        async def relay() -> AsyncIterator[bytes]:
            answer = StreamAnswer(step.family)
            try:
                async for sse in httpx2.EventSource(upstream):
                    if answer.feed(sse.event, sse.data):
                        # Recorded before the caller sees the end, so its next request finds it.
                        await self._record(step, answer.answer())
                    yield _sse_bytes(sse.event, sse.data)
            finally:
                await upstream.aclose()

        return _passed(step, upstream, relay())

    async def _after_error(self, step: _Step, upstream: httpx2.Response, retried: bool) -> _Step | None:
        """The step to try once more after a context-length refusal, else None (passed through)."""
        try:
            body = upstream.json()
        except ValueError:
            return None
        overflow = read_overflow(step.family, upstream.status_code, body)
        if overflow is None or retried:
            return None
        log.info("provider refused view %d as too long; preparing a smaller one", step.prepared.view_revision)
        try:
            prepared = await self._prepare(
                step.family,
                step.conversation,
                step.thread,
                step.conversation.items[-1].event_key,
                ProviderOverflow(
                    kind="context_length_exceeded",
                    provider_limit=overflow.limit,
                    provider_count=overflow.count,
                    our_estimate=max(1, step.prepared.budget_report.estimated_input),
                    view_revision=step.prepared.view_revision,
                ),
            )
        except ProviderContextExceeded:
            # The fleet already shrank this view once for the provider: the refusal stands, unchanged.
            return None
        return _Step(step.family, step.body, step.conversation, step.thread, step.headers, prepared)

    async def _record(self, step: _Step, answer: Answer) -> None:
        item = Item(f"{step.conversation.answer_position}.0", answer.payload)
        thread_id = f"{step.thread.run_id}.{step.thread.instance_id}"
        try:
            await self.client.append(_event(step.thread, item))
        except CtxError as exc:
            # The caller still gets its answer: its next request carries it, and it is published then.
            log.warning(
                "answer of %s not recorded (%s); it is published with the next request", thread_id, exc.code
            )
            return
        self.memory.keys(thread_id).add(item.event_key)
        if answer.input_tokens is not None:
            self.memory.usage[thread_id] = ReportedUsage(
                response_event_key=item.event_key,
                input_tokens=answer.input_tokens,
                output_tokens=answer.output_tokens,
                view_revision=step.prepared.view_revision,
            )


def _event(thread: ThreadRef, item: Item) -> Event:
    envelope: dict[str, Any] = {
        "event_key": item.event_key,
        "session_id": thread.session_id,
        "run_id": thread.run_id,
        "instance_id": thread.instance_id,
    }
    match item.payload:
        case SystemPayload() as payload:
            return SystemEvent(payload=payload, **envelope)
        case UserInputPayload() as payload:
            return UserInputEvent(payload=payload, **envelope)
        case AssistantMessagePayload() as payload:
            return AssistantMessageEvent(payload=payload, **envelope)
        case ToolOutcomePayload() as payload:
            return ToolOutcomeEvent(payload=payload, **envelope)
        case _ as unknown:
            assert_never(unknown)


def _passed(step: _Step, upstream: httpx2.Response, content: bytes | AsyncIterator[bytes]) -> Response:
    """The provider's status, headers and body, as the caller would have had them directly, and the
    thread the request was recorded in (``ctx-thread``)."""
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _NOT_RETURNED}
    headers["ctx-thread"] = f"{step.thread.run_id}.{step.thread.instance_id}"
    if isinstance(content, bytes):
        return Response(content, status_code=upstream.status_code, headers=headers)
    return StreamingResponse(content, status_code=upstream.status_code, headers=headers)


def _sse_bytes(event: str, data: str) -> bytes:
    # The SSE default event name is "message"; OpenAI's chat stream names none, so none is written.
    head = "" if event == "message" else f"event: {event}\n"
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"{head}{lines}\n".encode()


def _error_response(family: Family, error: CtxError) -> Response:
    """A fleet or input error in the provider's error shape, so the SDK raises its own error class."""
    status = 503 if error.retryable else (400 if isinstance(error, InvalidRequest) else 422)
    body: dict[str, Any]
    if family is Family.MESSAGES:
        body = {"type": "error", "error": {"type": "invalid_request_error", "message": error.message}}
    else:
        body = {
            "error": {"type": "invalid_request_error", "code": error.code.value, "message": error.message}
        }
    return JSONResponse(body, status_code=status, headers={"ctx-error": error.code.value})
