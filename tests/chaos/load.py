"""Agent runtimes under chaos: at-least-once publishers that ask for a prepared context as they go.

Each runtime owns one session and thread and publishes its events in order, one at a time, as an
agent does: an event is sent again until JetStream acknowledges it, and only then comes the next
one. After any failure it also re-publishes the last few acknowledged events (it cannot know
whether their acks were the ones lost), so duplicates reach the fleet exactly when it is weakest.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import nats
from nats.errors import Error as NatsError

from contracts import Event, PrepareRequest
from contracts.subjects import EVENTS_STREAM, events_subject
from ctxfleet_client.client import FleetClient
from contracts.exceptions import CtxError
from tests.fixtures.builders import Thread

__all__ = ["Poison", "Runtime", "connect_client", "plan_events", "poison_inputs"]

# Re-sent after any failed publish: the acks a crash may have swallowed.
_REPLAY_ACKED = 3
_PUBLISH_TIMEOUT_S = 2.0
_RETRY_PAUSE_S = 0.1


async def connect_client(nats_urls: tuple[str, ...], name: str) -> FleetClient:
    """A client that rides out a broker restart or a node's loss (the stock one gives up after three
    reconnects)."""
    nc = await nats.connect(
        list(nats_urls),
        name=name,
        connect_timeout=5,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        allow_reconnect=True,
        error_cb=_expected_during_outages,
    )
    return FleetClient(nc)


async def _expected_during_outages(exc: Exception) -> None:
    # Refused reconnects while a fault lasts are the point; the runtimes count their failed publishes.
    return None


def plan_events(t: Thread, count: int) -> list[Event]:
    """A runtime's conversation: user turns, tool calls with their outcomes, plain replies."""
    events: list[Event] = []
    for i in range(count):
        key = f"e{i:05d}"
        match i % 4:
            case 0:
                events.append(t.user(f"{t.session_id} asks question {i}", key=key))
            case 1:
                events.append(t.assistant(f"looking up {i}", calls=((f"c{i}", "lookup", {"n": i}),), key=key))
            case 2:
                events.append(t.outcome(f"c{i - 1}", f"row {i - 1} found", key=key))
            case _:
                events.append(t.assistant(f"answer {i}", key=key))
    return events


@dataclass
class Runtime:
    """One session's at-least-once publisher; counts what it sent and what the fleet answered."""

    client: FleetClient
    thread: Thread
    events: list[Event]
    pace_s: float
    prepare_every: int
    duplicate_rate: float
    rng: random.Random
    acked: list[str] = field(default_factory=list)
    publishes: int = 0
    duplicates_sent: int = 0
    failed_publishes: int = 0
    prepares: int = 0
    prepare_errors: Counter[str] = field(default_factory=Counter)
    # Acknowledged events this runtime will send once more, much later (see ``send_late``).
    late: list[Event] = field(default_factory=list)
    late_rate: float = 0.0

    async def run(self, deadline: float) -> None:
        """Publish every event (acknowledged) before ``deadline``, preparing every few events."""
        for i, event in enumerate(self.events):
            if await self._deliver(event, deadline):
                for earlier in self.events[max(0, i - _REPLAY_ACKED) : i]:
                    await self._deliver(earlier, deadline)
                    self.duplicates_sent += 1
            self.acked.append(event.event_key)
            if self.rng.random() < self.duplicate_rate:
                await self._deliver(event, deadline)  # a retry whose first ack did arrive
                self.duplicates_sent += 1
            if self.rng.random() < self.late_rate:
                self.late.append(event)
            if (i + 1) % self.prepare_every == 0:
                await self._prepare(event.event_key)
            await asyncio.sleep(self.pace_s)

    async def send(self, event: Event, deadline: float) -> None:
        """Publish one more event (acknowledged) outside the planned conversation."""
        self.events.append(event)
        await self._deliver(event, deadline)
        self.acked.append(event.event_key)

    async def send_late(self) -> int:
        """Re-publish the kept events as if the broker's duplicate window had long passed.

        Without a ``Nats-Msg-Id`` JetStream lets them through, as it would an old retry after the
        window: only the recorder's event-key check stands between them and a second record.
        """
        js = self.client._nc.jetstream(timeout=10.0)
        for event in self.late:
            data = event.model_dump_json().encode()
            await js.publish(
                events_subject(self.client.tenant, event.session_id, event.thread_id),
                data,
                stream=EVENTS_STREAM,
                headers={},  # no Nats-Msg-Id: as if past the duplicate window, so only Postgres dedups
            )
            self.publishes += 1
        return len(self.late)

    async def _deliver(self, event: Event, deadline: float) -> bool:
        """Publish until acknowledged; whether any attempt failed."""
        failed = False
        while True:
            self.publishes += 1
            try:
                await self.client.append(event, timeout=_PUBLISH_TIMEOUT_S)
                return failed
            except (CtxError, NatsError, TimeoutError) as exc:
                if isinstance(exc, CtxError) and not exc.retryable:
                    raise
                failed = True
                self.failed_publishes += 1
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.thread.thread_id}: {event.event_key} never acknowledged"
                    ) from exc
                await asyncio.sleep(_RETRY_PAUSE_S)

    async def _prepare(self, after_key: str) -> None:
        t = self.thread
        request = PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            budget_tokens=16_000,
            after_event_key=after_key,
            wait_ms=1_000,
        )
        self.prepares += 1
        try:
            await self.client.prepare(request, timeout=3.0)
        except CtxError as exc:  # expected while a fault lasts; the final prepare must succeed
            self.prepare_errors[exc.code.value] += 1


@dataclass(frozen=True)
class Poison:
    """An invalid input and why it is invalid."""

    name: str
    data: bytes


def poison_inputs(t: Thread, rng: random.Random, *, max_event_bytes: int) -> list[Poison]:
    """Garbage, malformed and hostile bodies under ``t``'s envelope, each of which must be dead-lettered."""

    def body(kind: str, payload_json: str) -> bytes:
        # Built as text: json.dumps cannot write NaN-free 1e999, lone surrogates or 1,200 levels.
        envelope = json.loads(t.raw(kind=kind, payload={}))
        envelope["payload"] = "@PAYLOAD@"
        return json.dumps(envelope).replace('"@PAYLOAD@"', payload_json).encode()

    nested = '{"a":' * 1200 + "1" + "}" * 1200
    call = '{{"text": "", "tool_calls": [{{"call_id": "x", "name": "lookup", "args": {}}}]}}'
    return [
        Poison("random_bytes", rng.randbytes(200)),
        Poison("malformed_json", t.raw(kind="user_input", payload={"text": "cut"})[:-7]),
        Poison("unknown_kind", t.raw(kind="telepathy", payload={"text": "x"})),
        Poison("oversize", t.raw(kind="user_input", payload={"text": "x" * (max_event_bytes + 1024)})),
        Poison("nul_in_text", body("user_input", '{"text": "a\\u0000b"}')),
        Poison("lone_surrogate", body("user_input", '{"text": "a\\ud800b"}')),
        Poison("nesting_1200", body("assistant_message", call.format(nested))),
        Poison("int_5000_digits", body("assistant_message", call.format('{"n": ' + "9" * 5000 + "}"))),
        Poison("float_1e999", body("assistant_message", call.format('{"n": 1e999}'))),
        Poison("nan", body("assistant_message", call.format('{"n": NaN}'))),
    ]
