"""Protected blocks: what of a request is each block's, hashed so any client can recompute it. Pure.

A provider request is read as a sequence of *units*, the smallest parts a runtime can add, drop or
edit on its own (docs/wire.md, "Protected blocks"):

- ``openai.chat``: each element of ``messages``, as it is;
- ``openai.responses``: one ``{"type": "instructions", "text": …}`` per leading system message that
  ``instructions`` joins (with two newlines), then each element of ``input``;
- ``anthropic.messages``: ``{"role": "system", "content": block}`` per ``system`` block, then
  ``{"role": <message role>, "content": block}`` per content block of each message (a string content
  is one text block); ``cache_control`` is left out, because breakpoints are placement, not content.

A block's hash is the sha256 of the canonical JSON (sorted keys, no whitespace, UTF-8) of the array
of its units, in order. The assembler fills ``PreparedContext.protected_block_manifest`` with the
hash of every required block; the gateway's check (``gateway_check``) reads the final request the
same way and compares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import assert_never

from pydantic import JsonValue

from contracts import (
    Authority,
    BlockKind,
    ChatMessage,
    ContextBlock,
    PreparedContext,
    ProtectedBlock,
    RequestFormat,
    Retention,
)
from services.core.hashing import canonical_json, sha256_hex
from services.core.providers.anthropic_messages import content_sources, message_blocks
from services.core.providers.bundle import leading_system
from services.core.providers.openai_responses import INSTRUCTIONS_JOIN, input_items, input_sources

__all__ = [
    "PreparedUnit",
    "RequestUnit",
    "authority_of",
    "block_hash",
    "build_manifest",
    "instruction_lengths",
    "prepared_units",
    "request_units",
]

# The record kinds whose words a block carries, from strongest to weakest claim on the block.
_BY_RECORD = (
    ("tool_outcome", Authority.TOOL_OUTPUT),
    ("assistant_message", Authority.MODEL),
    ("user_input", Authority.USER),
)


@dataclass(frozen=True, slots=True)
class RequestUnit:
    """One unit of a provider request, and what an addition check needs to know of it."""

    value: dict[str, JsonValue]
    # "system", "developer", "user", "assistant" or "tool".
    role: str
    # The unit's text when it is text only (no tool call, no tool result); additions must be.
    text: str | None
    # In the instruction position (leading system messages, ``instructions``, ``system``): there a
    # unit reads as the release's instructions.
    leading: bool

    @property
    def digest(self) -> str:
        return sha256_hex(canonical_json(self.value))


@dataclass(frozen=True, slots=True)
class PreparedUnit:
    """A unit of the prepared request and the block it belongs to (``None``: the adapter's framing)."""

    block_id: str | None
    unit: RequestUnit


def authority_of(block: ContextBlock) -> Authority:
    """Whose word ``block`` carries, from its kind and source records."""
    match block.kind:
        case BlockKind.INSTRUCTION:
            return Authority.RELEASE_INSTRUCTION if block.sources else Authority.FLEET_INSTRUCTION
        case BlockKind.TASK:
            return Authority.USER
        case BlockKind.SUMMARY | BlockKind.STATE:
            return Authority.FLEET_DERIVED
        case BlockKind.MATERIAL:
            return Authority.MATERIAL
        case BlockKind.INTERACTION:
            kinds = {s.kind for s in block.sources}
            return next((a for k, a in _BY_RECORD if k in kinds), Authority.FLEET_DERIVED)
        case _:
            assert_never(block.kind)


def block_hash(units: Sequence[RequestUnit]) -> str:
    """The hash of a block: sha256 of the canonical JSON array of its units."""
    return sha256_hex(canonical_json([u.value for u in units]))


def build_manifest(
    format: RequestFormat,
    blocks: Sequence[ContextBlock],
    messages: Sequence[ChatMessage],
    failed: frozenset[str] = frozenset(),
) -> tuple[ProtectedBlock, ...]:
    """The manifest of every required block, in order; ``failed``: the failed tool calls' ids.

    Each block's units are rendered from its own messages, as the adapters render them into the body
    (``prepared_units`` reads them back from the body: the unit tests hold both to one hash), so a
    prepare hashes its few required blocks and never walks the whole request.
    """
    required = [n for n, b in enumerate(blocks) if b.retention is Retention.REQUIRED]
    if not required:
        return ()
    leading = leading_system(messages)
    out: list[ProtectedBlock] = []
    for n in required:
        block = blocks[n]
        # A block's units depend on its own messages and on whether it opens the request (where a
        # system message is an instruction, elsewhere a developer or ``[system]`` note).
        own = _block_units(format, messages, block, leading, failed)
        out.append(
            ProtectedBlock(
                block_id=block.block_id,
                kind=block.kind,
                authority=authority_of(block),
                sources=block.sources,
                sha256=block_hash(own),
                units=len(own),
            )
        )
    return tuple(out)


def prepared_units(prepared: PreparedContext) -> tuple[PreparedUnit, ...]:
    owners = _owners(prepared.blocks, len(prepared.messages))
    body = _body(prepared)
    units = request_units(prepared.format, body, instruction_lengths(prepared))
    sources = _sources(prepared.format, prepared.messages)
    assert len(sources) == len(units), "the adapter rendered one unit per source"
    return tuple(
        PreparedUnit(owners[s] if s >= 0 else None, unit) for s, unit in zip(sources, units, strict=True)
    )


def instruction_lengths(prepared: PreparedContext) -> tuple[int, ...]:
    """The lengths of the texts ``instructions`` joins (``openai.responses``; empty otherwise)."""
    if prepared.format != "openai.responses":
        return ()
    leading = leading_system(prepared.messages)
    return tuple(len(m.content or "") for m in prepared.messages[:leading])


def request_units(
    format: RequestFormat, body: Mapping[str, JsonValue], instructions: Sequence[int] = ()
) -> tuple[RequestUnit, ...]:
    """The units of a provider request body, in order.

    ``instructions``: the lengths of the prepared texts ``openai.responses`` joined into
    ``instructions``; the final one is cut at them, and what does not fit them is one more unit.
    """
    match format:
        case "openai.chat":
            return _chat_request_units(body)
        case "openai.responses":
            return _responses_units(body, instructions)
        case "anthropic.messages":
            return _anthropic_units(body)
        case _:
            assert_never(format)


def _body(prepared: PreparedContext) -> Mapping[str, JsonValue]:
    if prepared.request is not None:
        return prepared.request
    return {"messages": list(prepared.openai_messages())}


def _owners(blocks: Sequence[ContextBlock], messages: int) -> list[str | None]:
    owners: list[str | None] = [None] * messages
    for b in blocks:
        for i in range(b.first_message, b.first_message + b.message_count):
            owners[i] = b.block_id
    return owners


def _sources(format: RequestFormat, messages: Sequence[ChatMessage]) -> list[int]:
    match format:
        case "openai.chat":
            return list(range(len(messages)))
        case "openai.responses":
            leading, sources = input_sources(tuple(messages))
            return [*range(leading), *sources]
        case "anthropic.messages":
            return content_sources(messages)
        case _:
            assert_never(format)


def _block_units(
    format: RequestFormat,
    messages: Sequence[ChatMessage],
    block: ContextBlock,
    leading: int,
    failed: frozenset[str],
) -> list[RequestUnit]:
    first, end = block.first_message, block.first_message + block.message_count
    match format:
        case "openai.chat":
            return _chat_units(messages, first, block.message_count, leading)
        case "openai.responses":
            out: list[RequestUnit] = []
            for i in range(first, end):
                text = messages[i].content or ""
                if i < leading:
                    out.append(RequestUnit({"type": "instructions", "text": text}, "system", text, True))
                else:
                    out.extend(_responses_item(_object(item)) for item in input_items(messages[i]))
            return out
        case "anthropic.messages":
            system = [
                _anthropic_unit("system", {"type": "text", "text": messages[i].content or ""}, leading=True)
                for i in range(first, min(end, leading))
                if messages[i].content
            ]
            rest = message_blocks(messages, max(first, leading), end, failed) if end > leading else []
            return system + [_anthropic_unit(role, b, leading=False) for role, b in rest]
        case _:
            assert_never(format)


def _chat_units(messages: Sequence[ChatMessage], first: int, count: int, leading: int) -> list[RequestUnit]:
    return [
        _chat_unit(messages[i].model_dump(mode="json", exclude_none=True), i < leading)
        for i in range(first, first + count)
    ]


def _chat_request_units(body: Mapping[str, JsonValue]) -> tuple[RequestUnit, ...]:
    out: list[RequestUnit] = []
    leading = True
    for message in _list(body.get("messages")):
        value = _object(message)
        leading = leading and value.get("role") == "system"
        out.append(_chat_unit(value, leading))
    return tuple(out)


def _chat_unit(value: dict[str, JsonValue], leading: bool) -> RequestUnit:
    role = str(value.get("role", ""))
    text = None if value.get("tool_calls") or role == "tool" else _text_of(value.get("content"))
    return RequestUnit(value, role, text, leading)


def _responses_units(body: Mapping[str, JsonValue], lengths: Sequence[int]) -> tuple[RequestUnit, ...]:
    out: list[RequestUnit] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.extend(
            RequestUnit({"type": "instructions", "text": part}, "system", part, True)
            for part in _split_instructions(instructions, lengths)
        )
    out.extend(_responses_item(_object(item)) for item in _list(body.get("input")))
    return tuple(out)


def _responses_item(value: dict[str, JsonValue]) -> RequestUnit:
    kind = value.get("type", "message")
    if kind == "message":
        return RequestUnit(value, str(value.get("role", "")), _text_of(value.get("content")), False)
    return RequestUnit(value, "tool" if kind == "function_call_output" else "assistant", None, False)


def _split_instructions(text: str, lengths: Sequence[int]) -> list[str]:
    """``text`` cut at the prepared parts' lengths, as long as it has their shape; the rest is one part."""
    parts: list[str] = []
    pos = 0
    for n, length in enumerate(lengths):
        if n:
            if not text.startswith(INSTRUCTIONS_JOIN, pos):
                break
            pos += len(INSTRUCTIONS_JOIN)
        if pos + length > len(text):
            break
        parts.append(text[pos : pos + length])
        pos += length
    rest = text[pos:]
    if rest.startswith(INSTRUCTIONS_JOIN) and parts:
        rest = rest[len(INSTRUCTIONS_JOIN) :]
    if rest:
        parts.append(rest)
    return parts


def _anthropic_units(body: Mapping[str, JsonValue]) -> tuple[RequestUnit, ...]:
    out: list[RequestUnit] = []
    for block in _content_blocks(body.get("system")):
        out.append(_anthropic_unit("system", block, leading=True))
    for message in _list(body.get("messages")):
        value = _object(message)
        role = str(value.get("role", ""))
        for block in _content_blocks(value.get("content")):
            out.append(_anthropic_unit(role, block, leading=False))
    return tuple(out)


def _anthropic_unit(role: str, block: dict[str, JsonValue], *, leading: bool) -> RequestUnit:
    content = {k: v for k, v in block.items() if k != "cache_control"}
    text = content.get("text") if content.get("type") == "text" else None
    return RequestUnit(
        {"role": role, "content": content}, role, text if isinstance(text, str) else None, leading
    )


def _content_blocks(value: JsonValue) -> list[dict[str, JsonValue]]:
    if isinstance(value, str):
        return [{"type": "text", "text": value}] if value else []
    return [_object(b) for b in _list(value)]


def _text_of(content: JsonValue) -> str | None:
    """A content's text: a string, or a list of text parts joined; ``None`` for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                return None
            texts.append(str(part["text"]))
        return "".join(texts)
    return None


def _list(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def _object(value: JsonValue) -> dict[str, JsonValue]:
    # A non-object element is kept as a unit of its own, so it can only ever fail to match.
    return value if isinstance(value, dict) else {"unparsed": value}
