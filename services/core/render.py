"""How a record looks to the model, and what it costs in tokens.

Rendering is fixed at recording time (the view text of a long tool result, the token counts per
encoding), so a prepare never re-tokenizes history. Material from resources and child agents is
framed as quoted material in a user message: text from a tool, a file or a child can never
appear with instruction authority.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from typing import assert_never

from pydantic import JsonValue

from contracts import (
    AssistantMessagePayload,
    ChildResultPayload,
    ContextExportPayload,
    ContextResetPayload,
    EventKind,
    OperationReconcilePayload,
    PhaseChangePayload,
    ResourceActivatedPayload,
    RunStatusPayload,
    StatePatchPayload,
    SystemPayload,
    ToolOutcomePayload,
    ToolStatus,
    UserInputPayload,
)

from services.core.records import RecordBody, TokenCounts, parse_body
from services.core import json_text
from services.core.context_tools import read_back_with_tool
from services.core.tokens import EncodingName, TokenCounter, estimate_tokens

__all__ = [
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMING",
    "TOOL_CALL_OVERHEAD",
    "RenderedCall",
    "TokenCounts",
    "arguments_json",
    "content_of",
    "count_record",
    "count_rendered",
    "name_read_tool",
    "omitted_marker",
    "read_back_ref",
    "read_back_with_tool",
    "record_content",
    "telling_line",
    "trim_to_fit",
    "trim_tool_text",
]

# Chat-format overheads in tokens, after OpenAI's published counting recipe: every message costs
# ~3 tokens plus its role, the reply is primed with 3, and each tool call carries wrapper fields.
# They are constants so that the same history always costs the same.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3
TOOL_CALL_OVERHEAD = 3

_BLOB_REF = re.compile(r"ctx://blob/[0-9a-f]{64}")
# How every stored preview names its blob (the recorder's head + tail and mask markers).
_READ_BACK_FROM = re.compile(r"read it back from (ctx://blob/[0-9a-f]{64})")
# What makes a failed output's line telling, most telling first: an error class or a failing test;
# then an error word, a fatal message, an exit status.
_TELLING = (
    re.compile(r"\b\w*(Error|Exception)\b|\bFAILED\b|\bFAIL:|Traceback"),
    re.compile(
        r"\berror\b|\bfatal\b|\bfail(ed|ure)?\b|\bassert|exit (status|code)|returncode|\bdenied\b|not found",
        re.IGNORECASE,
    ),
)
_TELLING_MAX_CHARS = 300
_KEPT_PREFIX = "[telling line: "


@dataclass(frozen=True, slots=True)
class RenderedCall:
    call_id: str
    name: str
    arguments: str


def arguments_json(args: Mapping[str, JsonValue]) -> str:
    """Tool arguments as the JSON string OpenAI expects, keys in the order the model wrote them."""
    return json_text.compact(args)


def content_of(kind: str, payload: Mapping[str, JsonValue], text: str) -> str:
    """The message content of a record, given its stored payload and its (possibly trimmed) text.

    The recorder counts tokens with this before the record exists; both sides render through
    :func:`record_content`, so what was counted is what is shown.
    """
    return record_content(parse_body(EventKind(kind), payload), text)


def record_content(body: RecordBody, text: str) -> str:
    """The message content of a record, given its typed body and its (possibly trimmed) text."""
    match body:
        case ToolOutcomePayload():
            return text if body.status is ToolStatus.SUCCESS else f"[tool status: {body.status}]\n{text}"
        case ResourceActivatedPayload():
            head = f"[material: resource {body.resource_id}"
            if body.revision:
                head += f" revision {body.revision}"
            if body.uri:
                head += f" at {body.uri}"
            head += "]"
            if body.title:
                head += f" {body.title}"
            return f"{head}\n{text}"
        case ChildResultPayload():
            return _child_result_text(body)
        case (
            SystemPayload()
            | UserInputPayload()
            | AssistantMessagePayload()
            | RunStatusPayload()
            | ContextExportPayload()
            | ContextResetPayload()
            | StatePatchPayload()
            | OperationReconcilePayload()
            | PhaseChangePayload()
        ):
            return text
        case _:
            assert_never(body)


def _child_result_text(body: ChildResultPayload) -> str:
    lines = [
        f"[material: result of child agent {body.child_instance_id}, status {body.status}]",
        f"Conclusion: {body.conclusion}",
    ]
    for label, items in (
        ("Evidence", body.evidence_refs),
        ("Artifacts", body.artifact_refs),
        ("Unresolved", body.unresolved),
    ):
        if items:
            lines.append(f"{label}: " + "; ".join(items))
    return "\n".join(lines)


def omitted_marker(omitted: int, full: int, where: str) -> str:
    """The one marker for a cut text: how many of its tokens are left out, and ``where`` to read them.

    ``where`` is the rest of the sentence after "tokens omitted" (the recorder's says the output's
    size and its blob, the assembler's why it cut and how to read the text back).
    """
    return f"\n[… {omitted} of {full} tokens omitted {where} …]\n"


def trim_tool_text(
    text: str,
    counter: TokenCounter,
    *,
    max_tokens: int,
    blob_ref: str,
    keep: str | None = None,
    what: str = "output",
) -> tuple[str, int] | None:
    """Head + tail of a tool result (or another recorded ``what``: a user's input) over ``max_tokens``,
    with its size and where the rest is.

    ``keep`` is a line that must stay visible (a failed output's telling line, see
    :func:`telling_line`): when the cut would lose it, it follows the marker. Returns
    ``(view_text, full_tokens)``, or ``None`` when the text fits as it is.
    """
    full = counter.count(text)
    if full <= max_tokens:
        return None
    kept = ""
    if keep is not None:
        kept = f"{_KEPT_PREFIX}{keep}]\n"
        max_tokens = max(0, max_tokens - counter.count(kept))
    head_n = max_tokens * 3 // 5
    tail_n = max_tokens - head_n
    head, tail = counter.head_tail(text, head_tokens=head_n, tail_tokens=tail_n)
    if keep is not None and (keep in head or keep in tail):
        return trim_tool_text(
            text, counter, max_tokens=max_tokens + counter.count(kept), blob_ref=blob_ref, what=what
        )
    lines = text.count("\n") + 1
    marker = omitted_marker(
        full - head_n - tail_n,
        full,
        f"(full {what}: {len(text)} chars, {lines} lines; read it back from {blob_ref})",
    )
    return head + marker + kept + tail, full


def count_record(
    counters: Mapping[EncodingName, TokenCounter], content: str, calls: Sequence[RenderedCall]
) -> TokenCounts:
    """Tokens of a rendered record's content and tool calls, without per-message overhead."""
    return TokenCounts(
        o200k_base=count_rendered(counters["o200k_base"], content, calls),
        cl100k_base=count_rendered(counters["cl100k_base"], content, calls),
    )


def count_rendered(counter: TokenCounter | None, content: str, calls: Sequence[RenderedCall]) -> int:
    """:func:`count_record` in one encoding (``None``: the bytes/4 estimate)."""
    n = _count(counter, content)
    for call in calls:
        n += _count(counter, call.name) + _count(counter, call.arguments) + _count(counter, call.call_id)
        n += TOOL_CALL_OVERHEAD
    return n


def read_back_ref(text: str) -> str | None:
    """The ``ctx://blob/…`` reference a (trimmed or masked) text names, if any."""
    found = _BLOB_REF.search(text)
    return found.group(0) if found else None


def name_read_tool(text: str) -> str:
    """``text`` with each preview's "read it back from <blob ref>" naming the tool that reads it."""
    return _READ_BACK_FROM.sub(lambda m: read_back_with_tool(m.group(1)), text)


def telling_line(text: str) -> str | None:
    """The line of a failed output that tells what failed: the last one of the most telling kind present."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not _BLOB_REF.search(line)]
    for tier in _TELLING:
        flagged = [line for line in lines if tier.search(line)]
        if flagged:
            line = flagged[-1]
            if line.startswith(_KEPT_PREFIX) and line.endswith("]"):
                line = line[len(_KEPT_PREFIX) : -1]  # kept by an earlier cut: the line itself
            return line if len(line) <= _TELLING_MAX_CHARS else line[: _TELLING_MAX_CHARS - 1] + "…"
    return None


def trim_to_fit(text: str, counter: TokenCounter | None, *, max_tokens: int, read_back: str) -> str:
    """Head + tail of ``text`` in at most ``max_tokens`` (marker included, when the marker fits at all).

    ``read_back`` says where the whole text can be read again. Without a counter (the bytes/4
    estimate profile) the cut is by characters, four to a token.
    """
    full = _count(counter, text)
    if full <= max_tokens:
        return text
    keep = max_tokens
    for _ in range(4):  # cutting on token boundaries can cost a token or two more once re-joined
        where = f"to fit the context; {read_back}"
        room = max(0, keep - _count(counter, omitted_marker(full, full, where)))
        head_n = room * 3 // 5
        tail_n = room - head_n
        head, tail = _head_tail(counter, text, head_n, tail_n)
        out = head + omitted_marker(full - head_n - tail_n, full, where) + tail
        over = _count(counter, out) - max_tokens
        if over <= 0 or room == 0:
            return out
        keep -= over
    return out


def _count(counter: TokenCounter | None, text: str) -> int:
    return counter.count(text) if counter is not None else estimate_tokens(text)


def _head_tail(counter: TokenCounter | None, text: str, head_n: int, tail_n: int) -> tuple[str, str]:
    if counter is not None:
        return counter.head_tail(text, head_tokens=head_n, tail_tokens=tail_n)
    # Four bytes to a token is the estimate's own rule; characters stand in for bytes here.
    return text[: head_n * 4], (text[len(text) - tail_n * 4 :] if tail_n else "")
