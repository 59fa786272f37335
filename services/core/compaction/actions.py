"""Which tool calls changed the world: the one place the verb lists live. Pure.

An agent acting through business tools (``cancel_reservation``, ``move_item``) must still know,
after its history is summarized, which side effects it already caused and with which values — or
it repeats them. A call is an action when its tool name's verb mutates and the call is neither a
file tool nor a shell (those are files_modified / commands). The verb is the first word of the
tool name's last segment (after ``.`` or ``__``; snake, kebab and camel case split alike), so
``crm.updateContact``, ``mcp__shop__cancel_order`` and ``book_reservation`` all classify. A read
verb, or one on neither list, is not an action: an unknown verb is not guessed at.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from pydantic import JsonValue

from services.core.compaction.files import files_of_call

__all__ = [
    "MUTATING_NAMES",
    "MUTATING_VERBS",
    "OVERWRITING_VERBS",
    "READ_VERBS",
    "action_args",
    "is_action",
    "overwrites",
    "primary_id",
    "tool_words",
]

# Verbs whose call changes state outside the conversation (bookings, tickets, stock, messages).
MUTATING_VERBS = frozenset(
    "update cancel book create delete remove send transfer move set add write submit pay refund modify change"
    " apply post put insert assign approve reject close exchange return reserve register schedule reschedule"
    " upgrade downgrade issue grant revoke enable disable reset activate deactivate archive restore merge"
    " link unlink attach detach upload publish rename edit replace toggle mark place order purchase buy"
    " sell charge withdraw deposit escalate reopen resolve confirm accept decline block unblock suspend"
    " terminate start stop restart deploy notify email message reply invite".split()
)
# Multi-word names whose first word alone is ambiguous ("open" a file reads it; "open_ticket" acts).
MUTATING_NAMES = (
    "open_ticket",
    "open_case",
    "open_account",
    "open_issue",
    "log_issue",
    "make_payment",
    "make_booking",
)
# Verbs that only look: never actions, whatever follows them.
READ_VERBS = frozenset(
    "get list search find view read count check calculate compute think lookup look fetch describe show query"
    " inspect browse retrieve load verify validate estimate preview explain summarize open print display"
    " is has can".split()
)
# Mutations that overwrite a value (the latest one on a target is what holds), unlike bookings,
# messages or payments, where every call is a side effect of its own: only these are superseded.
OVERWRITING_VERBS = frozenset(
    "update set move modify change assign rename replace toggle edit mark reschedule upgrade downgrade"
    " enable disable activate deactivate".split()
)
# Words that make a tool a file or shell tool: its effects are files_modified and commands.
_FILE_WORDS = frozenset(
    "file files dir directory folder path patch editor bash shell sh terminal exec command".split()
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_MAX_ARGS = 400  # compact JSON kept verbatim up to this; a longer one is clipped, never dropped


def tool_words(name: str) -> tuple[str, ...]:
    """The lower-case words of a tool name's last segment: ``mcp__crm__updateContact`` → (update, contact)."""
    last = re.split(r"__|\.", name.strip())[-1]
    return tuple(w for w in re.split(r"[_\-\s]+", _CAMEL.sub("_", last).lower()) if w)


def is_action(name: str, args: Mapping[str, JsonValue]) -> bool:
    """Whether a call of tool ``name`` with ``args`` changed state outside files and shell."""
    words = tool_words(name)
    if not words or _FILE_WORDS.intersection(words):
        return False
    joined = "_".join(words)
    named = any(joined == n or joined.startswith(n + "_") for n in MUTATING_NAMES)
    if not named and (words[0] in READ_VERBS or words[0] not in MUTATING_VERBS):
        return False
    access = files_of_call(name, args)
    return not (access.read or access.modified)


def action_args(args: Mapping[str, JsonValue]) -> str:
    """The arguments verbatim as compact JSON, in the caller's key order (clipped only if huge)."""
    text = json.dumps(dict(args), separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= _MAX_ARGS else text[: _MAX_ARGS - 1] + "…"


def primary_id(args: Mapping[str, JsonValue]) -> str:
    """``key=value`` of the first scalar ``id`` / ``*_id`` argument:
    what a later action on it supersedes ("" if none)."""
    for key, value in args.items():
        lowered = key.lower()
        if (lowered == "id" or lowered.endswith("_id") or key.endswith("Id")) and isinstance(
            value, str | int
        ):
            return f"{key}={value}"
    return ""


def overwrites(tool: str) -> bool:
    """Whether a later success of ``tool`` on the same target makes an earlier one moot."""
    words = tool_words(tool)
    return bool(words) and words[0] in OVERWRITING_VERBS
