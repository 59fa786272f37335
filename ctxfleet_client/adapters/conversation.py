"""One framework conversation as a fleet thread: record what is new, prepare what the model sees.

Every adapter turns its framework's messages into :data:`Turn` payloads, in conversation order, and
its prepared context back. The event key of a turn is its position in the conversation
(``m<position>``): a replayed or resumed graph publishes the same key with the same body, which
JetStream or the recorder drops, so nothing is recorded twice. The conversation is append-only from
the fleet's side: a framework that rewrote an earlier message would publish another body under a
recorded key, and the fleet refuses that (``event_rejected``) rather than record a second history.

A model reply recorded with the provider's ``usage`` is reported on the next prepare
(``ReportedUsage``), where it calibrates the profile's counts, as the proxy reports its answers'.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias, TypedDict, assert_never

from pydantic import JsonValue

from contracts import (
    AssistantMessageEvent,
    AssistantMessagePayload,
    ChatMessage,
    ContextResetEvent,
    ContextResetPayload,
    Event,
    PreparedContext,
    PrepareRequest,
    ReportedUsage,
    SystemEvent,
    SystemPayload,
    ToolOutcomeEvent,
    ToolOutcomePayload,
    ToolSchema,
    UserInputEvent,
    UserInputPayload,
)
from contracts.exceptions import ThreadNotFound
from contracts.prepare import RequestFormat

if TYPE_CHECKING:
    from ctxfleet_client.client import FleetClient

__all__ = ["FleetConversation", "Turn", "call_arguments", "tool_names"]

# A context reset starts the context over; the ledger keeps what came before (``inspect``, read-back).
Turn: TypeAlias = (
    SystemPayload | UserInputPayload | AssistantMessagePayload | ToolOutcomePayload | ContextResetPayload
)

_KEY = re.compile(r"^m(\d+)$")


class FleetConversation:
    """A conversation recorded in the fleet's thread ``(run_id, instance_id)`` of ``session_id``.

    The budget is a built-in ``model_profile`` or ``budget_tokens``, as in ``PrepareRequest``.
    """

    def __init__(
        self,
        fleet: FleetClient,
        *,
        session_id: str,
        run_id: str,
        instance_id: str = "main",
        budget_tokens: int | None = None,
        model_profile: str | None = None,
    ) -> None:
        """Name the thread and the budget; nothing is sent until the first record."""
        self.fleet = fleet
        self.session_id = session_id
        self.run_id = run_id
        self.instance_id = instance_id
        self.budget_tokens = budget_tokens
        self.model_profile = model_profile
        # How many turns this process knows to be published; after a restart it starts at 0 and
        # the republished turns are duplicates the fleet drops.
        self._recorded = 0
        self._last_key: str | None = None
        self._resumed = False
        # The view revision of this process's last prepare, until a reply to it is recorded; then
        # that reply's usage, until the next prepare reports it.
        self._answering: int | None = None
        self._usage: ReportedUsage | None = None

    @property
    def thread_id(self) -> str:
        """The fleet's thread id, ``<run_id>.<instance_id>``."""
        return f"{self.run_id}.{self.instance_id}"

    @property
    def recorded(self) -> int:
        """How many turns of the conversation this process knows to be recorded."""
        return self._recorded

    async def record(self, history: Sequence[Turn], *, start: int = 0) -> None:
        """Publish the turns at positions ``start …`` that this process has not published yet."""
        for position in range(max(self._recorded, start), start + len(history)):
            await self._publish(position, history[position - start])

    async def extend(self, turns: Sequence[Turn]) -> None:
        """Publish ``turns`` after the last one the thread recorded (for frameworks that hand increments)."""
        await self.resume()
        await self.record(turns, start=self._recorded)

    async def prepare(
        self, tools: Sequence[ToolSchema] = (), *, format: RequestFormat = "openai.chat"
    ) -> PreparedContext:
        """The context the model sees next: everything recorded, within the budget."""
        request = PrepareRequest(
            session_id=self.session_id,
            run_id=self.run_id,
            instance_id=self.instance_id,
            budget_tokens=self.budget_tokens,
            model_profile=self.model_profile,
            tools=tuple(tools),
            format=format,
            after_event_key=self._last_key,
            usage=self._usage,
        )
        prepared = await self.fleet.prepare(request)
        self._usage, self._answering = None, prepared.view_revision
        return prepared

    async def resume(self) -> None:
        """Continue after the thread's last recorded turn (asks the fleet once per process).

        The fleet answers what its recorder committed, which a process still publishing to the
        thread may be ahead of: one conversation is served by one process at a time.
        """
        if self._resumed:
            return
        self._resumed = True
        try:
            # A prepare, not an inspection: a runtime's identity may prepare, only operators inspect.
            last_key = (await self.prepare()).source_watermark.last_event_key
        except ThreadNotFound:
            return
        finally:
            # The republished replies answered contexts of an earlier process: their usage says nothing.
            self._answering = None
        found = _KEY.match(last_key or "")
        if found is not None:
            self._recorded = int(found.group(1)) + 1
            self._last_key = last_key

    async def _publish(self, position: int, turn: Turn) -> None:
        key = f"m{position}"
        await self.fleet.append(self._event(key, turn))
        self._recorded = position + 1
        self._last_key = key
        if isinstance(turn, AssistantMessagePayload):
            if turn.usage is not None and self._answering is not None:
                self._usage = ReportedUsage(
                    response_event_key=key,
                    input_tokens=turn.usage.input_tokens,
                    output_tokens=turn.usage.output_tokens,
                    view_revision=self._answering,
                )
            self._answering = None

    def _event(self, key: str, turn: Turn) -> Event:
        thread = (self.session_id, self.run_id, self.instance_id)
        match turn:
            case SystemPayload():
                return SystemEvent(event_key=key, **_ids(*thread), payload=turn)
            case UserInputPayload():
                return UserInputEvent(event_key=key, **_ids(*thread), payload=turn)
            case AssistantMessagePayload():
                return AssistantMessageEvent(event_key=key, **_ids(*thread), payload=turn)
            case ToolOutcomePayload():
                return ToolOutcomeEvent(event_key=key, **_ids(*thread), payload=turn)
            case ContextResetPayload():
                return ContextResetEvent(event_key=key, **_ids(*thread), payload=turn)
            case _:
                assert_never(turn)


class _Ids(TypedDict):
    session_id: str
    run_id: str
    instance_id: str


def _ids(session_id: str, run_id: str, instance_id: str) -> _Ids:
    return {"session_id": session_id, "run_id": run_id, "instance_id": instance_id}


def call_arguments(arguments: str) -> dict[str, JsonValue]:
    """A Chat tool call's JSON arguments as the object the frameworks hold (``{}`` when not an object)."""
    value: JsonValue = json.loads(arguments) if arguments else {}
    return value if isinstance(value, dict) else {}


def tool_names(messages: Sequence[ChatMessage]) -> dict[str, str]:
    """Each call id of the context's assistant messages, with its tool's name (a tool result names it)."""
    return {call.id: call.function.name for m in messages for call in m.tool_calls or ()}
