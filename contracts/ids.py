"""Identifier types and the one rule that makes them safe inside NATS subjects.

A thread is ``(run_id, instance_id)``. Its string form, ``ThreadId``, is
``"<run_id>.<instance_id>"`` so that it spans exactly two subject tokens:
``ctx.events.<tenant>.<session>.<run>.<instance>``. Identifiers therefore may not contain dots, wildcards or
whitespace.
"""

from __future__ import annotations

import re
from typing import Annotated, NewType

from pydantic import StringConstraints

__all__ = [
    "EVENT_KEY_PATTERN",
    "EventKey",
    "EventKeyStr",
    "ID_PATTERN",
    "Identifier",
    "InstanceId",
    "MAX_ID_LENGTH",
    "RunId",
    "SessionId",
    "ThreadId",
    "is_identifier",
    "split_thread_id",
    "thread_id_of",
]

# At most this many characters: an id is one NATS subject token (see ``contracts.subjects``).
MAX_ID_LENGTH = 128
ID_PATTERN = rf"^[A-Za-z0-9_-]{{1,{MAX_ID_LENGTH}}}$"
# Event keys are chosen by runtimes; they travel in the Nats-Msg-Id header, never in a subject,
# so they may hold ':' and '/' too (e.g. "turn-3/call:c1").
EVENT_KEY_PATTERN = r"^[A-Za-z0-9_:/.@=+-]{1,200}$"

Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
EventKeyStr = Annotated[str, StringConstraints(pattern=EVENT_KEY_PATTERN)]

SessionId = NewType("SessionId", str)
RunId = NewType("RunId", str)
InstanceId = NewType("InstanceId", str)
ThreadId = NewType("ThreadId", str)
EventKey = NewType("EventKey", str)

_ID_RE = re.compile(ID_PATTERN)


def is_identifier(value: str) -> bool:
    """Whether ``value`` may be used as a session, run or instance id."""
    # fullmatch: ``$`` alone also matches before a final newline, which would end a NATS protocol line.
    return bool(_ID_RE.fullmatch(value))


def thread_id_of(run_id: str, instance_id: str) -> ThreadId:
    """The thread of ``(run_id, instance_id)``; raises ``ValueError`` for an unsafe id."""
    for value in (run_id, instance_id):
        if not is_identifier(value):
            raise ValueError(f"not a valid id (allowed: {ID_PATTERN}): {value!r}")
    return ThreadId(f"{run_id}.{instance_id}")


def split_thread_id(thread_id: str) -> tuple[RunId, InstanceId]:
    """Inverse of :func:`thread_id_of`; raises ``ValueError`` for a malformed thread id."""
    parts = thread_id.split(".")
    if len(parts) != 2 or not all(is_identifier(p) for p in parts):
        raise ValueError(f"a thread id is '<run_id>.<instance_id>': {thread_id!r}")
    return RunId(parts[0]), InstanceId(parts[1])
