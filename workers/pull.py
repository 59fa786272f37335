"""Reading a partition without a fetch stall: what is there now at once, else wait for one event.

nats-py's ``fetch(n, timeout)`` leaves a lingering pull request for ``n`` messages on the server and,
once the first one arrives, waits for the other ``n - 1`` until its timeout: an event published while
the recorder idles sits in that half-filled request for up to the whole timeout, and every prepare
that waits for it (``after_event_key``) waits as long — a read-your-writes stall that grows with the
agent's think time (issue 16). Here no request outlives its answer:

- ``no_wait`` without ``expires``: the server sends what the consumer holds now, up to the batch,
  then a "no messages" status — the request ends there;
- when nothing is there, a lingering request for exactly one message (``fetch(1)``), which ends with
  that message; then what has arrived behind it, ``no_wait`` again.
"""

from __future__ import annotations

import json

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext

__all__ = ["available_now", "next_batch"]

# A "no messages" status answers a no_wait request at once; this only bounds a reply that was lost.
_STATUS_WAIT_S = 2.0


async def available_now(nc: NatsClient, sub: JetStreamContext.PullSubscription, batch: int) -> list[Msg]:
    """Up to ``batch`` messages the consumer holds now, without waiting for any to be published."""
    msgs = _queued(sub, batch)
    if msgs:
        return msgs
    # The subscription's own request subject and inbox: replies land in its pending queue. nats-py
    # offers no public no_wait-only pull (its fetch adds ``expires``, which makes the server linger).
    request = {"batch": batch, "no_wait": True}
    await nc.publish(sub._nms, json.dumps(request).encode(), sub._deliver)
    while len(msgs) < batch:
        try:
            msg = await sub._sub.next_msg(timeout=_STATUS_WAIT_S)
        except TimeoutError:
            break
        if JetStreamContext.is_status_msg(msg):
            break  # "no messages" / "request timeout": the request is over
        msgs.append(msg)
    return msgs


async def next_batch(
    nc: NatsClient, sub: JetStreamContext.PullSubscription, batch: int, *, idle_timeout: float
) -> list[Msg]:
    """What the consumer holds now, or — when nothing — the first event published within
    ``idle_timeout`` together with whatever arrived behind it; raises ``TimeoutError`` when idle."""
    msgs = await available_now(nc, sub, batch)
    if msgs:
        return msgs
    (first,) = await sub.fetch(1, timeout=idle_timeout)
    return [first, *await available_now(nc, sub, batch - 1)] if batch > 1 else [first]


def _queued(sub: JetStreamContext.PullSubscription, batch: int) -> list[Msg]:
    """Messages already delivered to the subscription (status replies of ended requests dropped)."""
    queue = sub._sub._pending_queue
    msgs: list[Msg] = []
    while len(msgs) < batch and not queue.empty():
        msg = queue.get_nowait()
        sub._sub._pending_size -= len(msg.data)
        if not JetStreamContext.is_status_msg(msg):
            msgs.append(msg)
    return msgs
