"""How a record looks to the model, and what it costs in tokens.

Rendering is fixed at recording time (the view text of a long tool result, the token counts per
encoding), so a prepare never re-tokenizes history. Material from resources and child agents is
framed as quoted material in a user message: text from a tool, a file or a child can never
appear with instruction authority (DESIGN.md rule 9).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import JsonValue

from .tokens import ENCODINGS, EncodingName, TokenCounter

__all__ = [
    "MESSAGE_OVERHEAD",
    "REPLY_PRIMING",
    "TOOL_CALL_OVERHEAD",
    "TOOL_SCHEMA_OVERHEAD",
    "RenderedCall",
    "TokenCounts",
    "arguments_json",
    "content_of",
    "count_record",
    "read_back_ref",
    "telling_line",
    "tool_schema_text",
    "tool_wire_text",
    "trim_to_fit",
    "trim_tool_text",
]

# Chat-format overheads in tokens, after OpenAI's published counting recipe: every message costs
# ~3 tokens plus its role, the reply is primed with 3, and each tool call or tool schema carries
# wrapper fields. They are constants so that the same history always costs the same.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3
TOOL_CALL_OVERHEAD = 3
TOOL_SCHEMA_OVERHEAD = 8

_BLOB_REF = re.compile(r"ctx://blob/[0-9a-f]{64}")
# What makes a failed output's line telling, most telling first: an error class or a failing test;
# then an error word, a fatal message, an exit status.
_TELLING = (
    re.compile(r"\b\w*(Error|Exception)\b|\bFAILED\b|\bFAIL:|Traceback"),
    re.compile(
        r"\berror\b|\bfatal\b|\bfail(ed|ure)?\b|\bassert|exit (status|code)|returncode|\bdenied\b|not found", re.IGNORECASE
    ),
)
_TELLING_MAX_CHARS = 300
_KEPT_PREFIX = "[telling line: "


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """Tokens of one piece of content in every supported encoding."""

    o200k_base: int
    cl100k_base: int

    def get(self, encoding: EncodingName) -> int:
        """Tokens in ``encoding``."""
        return self.o200k_base if encoding == "o200k_base" else self.cl100k_base


@dataclass(frozen=True, slots=True)
class RenderedCall:
    """A tool call as the model sees it."""

    call_id: str
    name: str
    arguments: str


def arguments_json(args: Mapping[str, JsonValue]) -> str:
    """Tool arguments as the JSON string OpenAI expects, keys in the order the model wrote them."""
    return json.dumps(args, ensure_ascii=False, separators=(",", ":"))


def content_of(kind: str, payload: Mapping[str, JsonValue], text: str) -> str:
    """The message content of a record, given its payload and its (possibly trimmed) text."""
    if kind == "tool_outcome":
        status = payload.get("status", "success")
        return text if status == "success" else f"[tool status: {status}]\n{text}"
    if kind == "resource_activated":
        head = f"[material: resource {payload.get('resource_id')}"
        if payload.get("revision"):
            head += f" revision {payload['revision']}"
        if payload.get("uri"):
            head += f" at {payload['uri']}"
        head += "]"
        if payload.get("title"):
            head += f" {payload['title']}"
        return f"{head}\n{text}"
    if kind == "child_result":
        return _child_result_text(payload)
    return text


def _child_result_text(payload: Mapping[str, JsonValue]) -> str:
    lines = [
        f"[material: result of child agent {payload.get('child_instance_id')}, status {payload.get('status')}]",
        f"Conclusion: {payload.get('conclusion', '')}",
    ]
    for label, key in (("Evidence", "evidence_refs"), ("Artifacts", "artifact_refs"), ("Unresolved", "unresolved")):
        items = payload.get(key) or []
        if isinstance(items, list) and items:
            lines.append(f"{label}: " + "; ".join(str(i) for i in items))
    return "\n".join(lines)


def trim_tool_text(
    text: str, counter: TokenCounter, *, max_tokens: int, blob_ref: str, keep: str | None = None
) -> tuple[str, int] | None:
    """Head + tail of a tool result over ``max_tokens``, with its size and where the rest is.

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
        return trim_tool_text(text, counter, max_tokens=max_tokens + counter.count(kept), blob_ref=blob_ref)
    lines = text.count("\n") + 1
    marker = (
        f"\n[… {full - head_n - tail_n} of {full} tokens omitted "
        f"(full output: {len(text)} chars, {lines} lines; read it back from {blob_ref}) …]\n"
    )
    return head + marker + kept + tail, full


def count_record(
    counters: Mapping[EncodingName, TokenCounter], content: str, calls: Sequence[RenderedCall]
) -> TokenCounts:
    """Tokens of a rendered record's content and tool calls, without per-message overhead."""
    totals: dict[EncodingName, int] = {}
    for name in ENCODINGS:
        c = counters[name]
        n = c.count(content)
        for call in calls:
            n += c.count(call.name) + c.count(call.arguments) + c.count(call.call_id) + TOOL_CALL_OVERHEAD
        totals[name] = n
    return TokenCounts(o200k_base=totals["o200k_base"], cl100k_base=totals["cl100k_base"])


def tool_schema_text(name: str, description: str, parameters: Mapping[str, JsonValue]) -> str:
    """The text a tool schema costs, in a stable serialization."""
    return json.dumps(
        {"name": name, "description": description, "parameters": parameters},
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
    )


def tool_wire_text(name: str, description: str, parameters: Mapping[str, JsonValue]) -> str:
    """One entry of the ``tools`` array as the provider is sent it (OpenAI function shape)."""
    return json.dumps(
        {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def read_back_ref(text: str) -> str | None:
    """The ``ctx://blob/…`` reference a (trimmed or masked) text names, if any."""
    found = _BLOB_REF.search(text)
    return found.group(0) if found else None


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
        marker = f"\n[… {{omitted}} of {full} tokens omitted to fit the context; {read_back} …]\n"
        room = max(0, keep - _count(counter, marker.format(omitted=full)))
        head_n = room * 3 // 5
        tail_n = room - head_n
        head, tail = _head_tail(counter, text, head_n, tail_n)
        out = head + marker.format(omitted=full - head_n - tail_n) + tail
        over = _count(counter, out) - max_tokens
        if over <= 0 or room == 0:
            return out
        keep -= over
    return out


def _count(counter: TokenCounter | None, text: str) -> int:
    if counter is not None:
        return counter.count(text)
    return (len(text.encode("utf-8")) + 3) // 4


def _head_tail(counter: TokenCounter | None, text: str, head_n: int, tail_n: int) -> tuple[str, str]:
    if counter is not None:
        return counter.head_tail(text, head_tokens=head_n, tail_tokens=tail_n)
    # Four bytes to a token is the estimate's own rule; characters stand in for bytes here.
    return text[: head_n * 4], (text[len(text) - tail_n * 4 :] if tail_n else "")
