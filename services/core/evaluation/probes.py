"""What the next step needs, read from the trace itself, and whether a context shows it.

The probes are computed here from the recorded events, independently of the fleet's summarizer,
so they can judge it: the run's task verbatim; every file written and every file read (named by
``services.core.compaction.files``); the telling line of the last failed call (by status or by what
its output shows: ``services.core.failures``) while no later call of the same tool/command has
succeeded; the first informative line of the last tool outcome; and the user's constraints
(sentences with must/never/always/do not/only…). A probe is present when its
text occurs in the context's message contents and tool-call arguments, whitespace normalized.
"""

from __future__ import annotations

from contracts import EventKind

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import assert_never

from pydantic import JsonValue

from contracts import ToolStatus

from services.core.compaction.files import FileAccess, files_of_call
from services.core.failures import failure_of
from services.core.trace import TraceCall, TraceLine

__all__ = [
    "MAX_PROBE_CHARS",
    "PROBE_KINDS",
    "Probe",
    "ProbeKind",
    "constraints_of",
    "haystack_of",
    "head_line",
    "is_present",
    "message_texts",
    "normalize",
    "probes_at",
    "telling_line",
]

# A probe line longer than this is checked by its beginning: an output of one 10,000-character
# line is shown trimmed by any system, and its start is what tells the model what happened.
MAX_PROBE_CHARS = 160
# How shell tools word a failure besides "error": `patch: **** malformed patch`, `cannot open`,
# `No such file or directory`, `Permission denied`… (a line of them beats the first line of output).
_ERROR_WORDS = re.compile(
    r"error|exception|traceback|failed|failure|fatal|assert|malformed|invalid|cannot|can't|unable|no such"
    r"|not found|denied|refused|aborted",
    re.IGNORECASE,
)
_NOISE = re.compile(r"^(?:<returncode>-?\d+</returncode>|</?output>|</?error>|bash-\$|\$|[\W_]*)$")
_CONSTRAINT = re.compile(
    r"\b(?:must|never|always|do not|don't|only|should not|shouldn't|make sure|avoid)\b", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_SHELL_KEYS = ("command", "cmd", "script")


class ProbeKind(StrEnum):
    """What a probe checks."""

    TASK = "task"
    FILES_WRITTEN = "files_written"
    FILES_READ = "files_read"
    LAST_ERROR = "last_error"
    LAST_OUTCOME = "last_outcome"
    CONSTRAINTS = "constraints"


PROBE_KINDS: tuple[ProbeKind, ...] = tuple(ProbeKind)


@dataclass(frozen=True, slots=True)
class Probe:
    """One thing the context must show, and the trace line it comes from."""

    kind: ProbeKind
    text: str
    line: int


def normalize(text: str) -> str:
    """Whitespace runs as one space, ends stripped."""
    return " ".join(text.split())


def message_texts(messages: Iterable[Mapping[str, JsonValue]], *, decoded: bool = False) -> list[str]:
    """What a model reads in ``messages``, in order: contents, then call arguments (with the strings
    inside them too when ``decoded``)."""
    parts: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            parts.append(content)
        calls = m.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                parts.append(arguments)
                if decoded:
                    parts.extend(_decoded_strings(arguments))
    return parts


def haystack_of(messages: Iterable[Mapping[str, JsonValue]]) -> str:
    """The normalized text a model sees in ``messages``: contents, call arguments raw and decoded."""
    return normalize("\n".join(message_texts(messages, decoded=True)))


def is_present(probe: Probe, haystack: str) -> bool:
    """Whether ``probe``'s text occurs in ``haystack`` (from ``haystack_of``)."""
    return normalize(probe.text) in haystack


def telling_line(text: str) -> str:
    """The last line naming an error (exception, failed, Traceback…), else the first informative line."""
    lines = [s for raw in text.splitlines() if (s := raw.strip()) and not _NOISE.match(s)]
    telling = next((s for s in reversed(lines) if _ERROR_WORDS.search(s)), lines[0] if lines else "")
    return telling[:MAX_PROBE_CHARS]


def head_line(text: str, command: str = "") -> str:
    """The first non-empty informative line: not a return-code tag, a bare marker, or the command echoed."""
    echo = normalize(command)
    for raw in text.splitlines():
        s = raw.strip()
        if s and not _NOISE.match(s) and normalize(s).lstrip("$ ") != echo:
            return s[:MAX_PROBE_CHARS]
    return ""


def constraints_of(text: str) -> list[str]:
    """The sentences of a user input that state a constraint."""
    out: list[str] = []
    for sentence in _SENTENCE_END.split(text):
        s = sentence.strip()
        if 8 <= len(s) <= 300 and _CONSTRAINT.search(s):
            out.append(s)
    return out


def probes_at(lines: Sequence[TraceLine]) -> list[Probe]:
    """The probes of a context prepared after ``lines`` (one run's events so far), in a stable order."""
    probes: list[Probe] = []
    calls: dict[str, TraceCall] = {}
    written: dict[str, int] = {}
    read: dict[str, int] = {}
    constraints: dict[str, int] = {}
    task: TraceLine | None = None
    last_failure: tuple[TraceLine, str, str] | None = None
    last_outcome: TraceLine | None = None
    for line in lines:
        kind = EventKind(line.kind)
        match kind:
            case EventKind.USER_INPUT:
                task = task or line
                for sentence in constraints_of(line.text):
                    constraints.setdefault(sentence, line.line)
            case EventKind.ASSISTANT_MESSAGE:
                for call in line.tool_calls:
                    calls[call.call_id] = call
                    access = _files_of(call.name, json.dumps(call.args, sort_keys=True))
                    for path in access.modified:
                        written.setdefault(path, line.line)
                    for path in access.read:
                        read.setdefault(path, line.line)
            case EventKind.TOOL_OUTCOME:
                last_outcome = line
                called = calls.get(line.call_id or "")
                key = _call_key(called)
                if failure := failure_of(called, ToolStatus(line.status), line.text):
                    # A failure only the output shows is told by the line that shows it.
                    telling = (
                        failure.line[:MAX_PROBE_CHARS]
                        if failure.shown_by == "output"
                        else telling_line(line.text)
                    )
                    last_failure = (line, key, telling)
                elif last_failure is not None and last_failure[1] == key:
                    last_failure = None
            case (
                EventKind.SYSTEM
                | EventKind.RESOURCE_ACTIVATED
                | EventKind.CHILD_RESULT
                | EventKind.RUN_STATUS
                | EventKind.CONTEXT_EXPORT
                | EventKind.CONTEXT_RESET
                | EventKind.STATE_PATCH
                | EventKind.OPERATION_RECONCILE
                | EventKind.PHASE_CHANGE
            ):
                pass  # instructions are not probed; the rest is not in the trace format
            case _:
                assert_never(kind)
    if task is not None and task.text.strip():
        probes.append(Probe(ProbeKind.TASK, task.text, task.line))
    probes += [Probe(ProbeKind.FILES_WRITTEN, p, n) for p, n in written.items()]
    probes += [Probe(ProbeKind.FILES_READ, p, n) for p, n in read.items()]
    if last_failure is not None and last_failure[2]:
        probes.append(Probe(ProbeKind.LAST_ERROR, last_failure[2], last_failure[0].line))
    if last_outcome is not None:
        if head := head_line(last_outcome.text, _command_of(calls.get(last_outcome.call_id or ""))):
            probes.append(Probe(ProbeKind.LAST_OUTCOME, head, last_outcome.line))
    probes += [Probe(ProbeKind.CONSTRAINTS, s, n) for s, n in constraints.items()]
    return probes


@functools.lru_cache(maxsize=65_536)
def _files_of(name: str, args_json: str) -> FileAccess:
    # Every prepare point re-reads the calls before it: parse each call's shell line once.
    return files_of_call(name, json.loads(args_json))


def _command_of(call: TraceCall | None) -> str:
    if call is None:
        return ""
    return next((v for k in _SHELL_KEYS if isinstance(v := call.args.get(k), str)), "")


def _call_key(call: TraceCall | None) -> str:
    """Same tool and, for a command-line tool, the same command: a success of it clears a failure."""
    if call is None:
        return ""
    return f"{call.name}\x00{_command_of(call)}"


def _decoded_strings(arguments: str) -> list[str]:
    try:
        value: JsonValue = json.loads(arguments)
    except ValueError:
        return []
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
    return out
