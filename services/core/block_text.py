"""Each block of a prepared context as text, as the model reads it. Pure.

A block is a run of the context's messages (``first_message``, ``message_count``); its text is
those messages, each headed by its role, with the tool calls an assistant message makes and the
call a tool message answers. The summary block carries no records of its own: its sources are the
records the summary cites, each of its lines naming them as ``(seq N)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts import BlockKind, ChatMessage, ContextBlock, PreparedContext

__all__ = ["BlockText", "block_text", "block_texts", "message_text"]


@dataclass(frozen=True, slots=True)
class BlockText:
    """One block's text, and the record seqs it shows or (a summary) cites."""

    block_id: str
    kind: str
    tokens: int
    text: str
    sources: tuple[int, ...]

    def head(self, chars: int) -> str:
        return self.text if len(self.text) <= chars else self.text[:chars]


def message_text(message: ChatMessage) -> str:
    """One message: its role (and the call it answers), its content, then each call it makes."""
    head = f"[{message.role}" + (f" → {message.tool_call_id}" if message.tool_call_id else "") + "]"
    lines = [head]
    if message.content:
        lines.append(message.content)
    for call in message.tool_calls or ():
        lines.append(f"call {call.function.name} {call.function.arguments} ({call.id})")
    return "\n".join(lines)


def block_text(prepared: PreparedContext, block: ContextBlock) -> BlockText:
    messages = prepared.messages[block.first_message : block.first_message + block.message_count]
    cited = prepared.summary.sources if block.kind is BlockKind.SUMMARY and prepared.summary else ()
    return BlockText(
        block_id=block.block_id,
        kind=block.kind.value,
        tokens=block.tokens,
        text="\n\n".join(message_text(m) for m in messages),
        sources=tuple(sorted(cited)) or tuple(r.seq for r in block.sources),
    )


def block_texts(prepared: PreparedContext) -> list[BlockText]:
    return [block_text(prepared, b) for b in prepared.blocks]
