"""How a record looks to the model, and what it costs in tokens.

Rendering is fixed at recording time (the view text of a long tool result, the token counts per
encoding), so a prepare never re-tokenizes history. Material from resources and child agents is
framed as quoted material in a user message: text from a tool, a file or a child can never
appear with instruction authority (DESIGN.md rule 9).
"""

from __future__ import annotations

import json
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
    "tool_schema_text",
    "trim_tool_text",
]

# Chat-format overheads in tokens, after OpenAI's published counting recipe: every message costs
# ~3 tokens plus its role, the reply is primed with 3, and each tool call or tool schema carries
# wrapper fields. They are constants so that the same history always costs the same.
MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3
TOOL_CALL_OVERHEAD = 3
TOOL_SCHEMA_OVERHEAD = 8


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
    text: str, counter: TokenCounter, *, max_tokens: int, blob_ref: str
) -> tuple[str, int] | None:
    """Head + tail of a tool result over ``max_tokens``, with its size and where the rest is.

    Returns ``(view_text, full_tokens)``, or ``None`` when the text fits as it is.
    """
    full = counter.count(text)
    if full <= max_tokens:
        return None
    head_n = max_tokens * 3 // 5
    tail_n = max_tokens - head_n
    head, tail = counter.head_tail(text, head_tokens=head_n, tail_tokens=tail_n)
    lines = text.count("\n") + 1
    marker = (
        f"\n[… {full - head_n - tail_n} of {full} tokens omitted "
        f"(full output: {len(text)} chars, {lines} lines; read it back from {blob_ref}) …]\n"
    )
    return head + marker + tail, full


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
