"""Fault injection for the recovery tests: die hard at a named point.

Set ``CTX_KILL_POINT=<name>`` (or ``<name>:<n>`` for the n-th time the point is reached) and the
process sends itself SIGKILL there — no exception handlers, no cleanup, exactly like a crash.
Unset in production, where every call is a dictionary lookup and a comparison.
"""

from __future__ import annotations

import os
import signal

__all__ = ["KILL_POINTS", "kill_point"]

KILL_POINTS = (
    "record.before_commit",
    "record.after_commit",
    "prepare.before_reply",
    "compact.before_commit",
    "compact.after_commit",
    "rollover.before_commit",
    "rollover.after_commit",
)
_hits: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL this process if ``CTX_KILL_POINT`` names this point (and its hit count)."""
    wanted = os.environ.get("CTX_KILL_POINT")
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
