"""A long, state-heavy warehouse thread generated in code: values superseded many times. Pure, no randomness.

The agent moves stock items between bins with ``move_item``; every bin code is used once, so a
superseded location can be told apart from the current one by its text alone (the pollution probe
of ``services.core.evaluation.pollution`` relies on it). Every few moves the user asks where an item
is now: what the agent needs then is the item's current bin, not its history. The release catalog
(``INVENTORY_CATALOG``) declares the move's effect, so the fleet's state projection follows each
move from the tool outcome, in code.
"""

from __future__ import annotations

import json

from contracts import PathRule, ToolCatalog, ToolEffect, ToolSpec

from services.core.trace import TraceCall, TraceLine

__all__ = [
    "INVENTORY_CATALOG",
    "INVENTORY_RELEASE",
    "INVENTORY_TASK",
    "inventory_trace",
    "item_path",
]

INVENTORY_RELEASE = "warehouse-eval@1"
INVENTORY_TASK = (
    "Rebalance the warehouse along the pick list: move each item to the bin the list names. "
    "Always answer where an item is with its current bin. Never move an item that is on hold."
)
INVENTORY_CATALOG = ToolCatalog(
    release=INVENTORY_RELEASE,
    paths=(PathRule(pattern="item:{id}.location", kind="business_fact"),),
    tools=(
        ToolSpec(
            name="move_item",
            reads=("item:{id}.location",),
            effects=(ToolEffect(path="item:{args.item_id}.location", value="{result.location}"),),
        ),
        ToolSpec(name="check_item", reads=("item:{id}.location",)),
    ),
)
_SYSTEM = (
    "You are a warehouse agent. Use move_item(item_id, to) to move stock and check_item(item_id) to "
    "look an item up. Report bins exactly as the tools return them."
)
# Odd strides over co-prime ranges: every item is visited in a fixed, scattered order, no RNG needed.
_ITEM_STRIDE = 7
_BIN_STRIDE = 3_137
_BINS = 10_000
# Every this many moves the user asks for an item's current bin.
_QUESTION_EVERY = 9


def item_path(item_id: str) -> str:
    """The state path of an item's location, as the catalog registers it."""
    return f"item:{item_id}.location"


def inventory_trace(moves: int = 600, items: int = 24) -> list[TraceLine]:
    """A system prompt, the task, then ``moves`` moves and the user's "where is it now?" questions."""
    lines = [
        TraceLine(line=1, kind="system", text=_SYSTEM),
        TraceLine(line=2, kind="user_input", text=INVENTORY_TASK),
    ]

    def add(kind: str, text: str, **more: object) -> None:
        lines.append(TraceLine(len(lines) + 1, kind, text, **more))  # type: ignore[arg-type]

    for step in range(moves):
        item = _item(step, items)
        to = _bin(step)
        call = TraceCall(call_id=f"mv_{step:05d}", name="move_item", args={"item_id": item, "to": to})
        add("assistant_message", f"Pick list line {step + 1}: {item} goes to {to}.", tool_calls=(call,))
        result = {"item_id": item, "location": to, "ok": True, "moved_units": 1 + step % 5}
        add("tool_outcome", json.dumps(result), call_id=call.call_id)
        if step % _QUESTION_EVERY == _QUESTION_EVERY - 1:
            asked = _item(step * 5 + 3, items)
            add("user_input", f"Where is {asked} now? Give its current bin.")
            check = TraceCall(call_id=f"ck_{step:05d}", name="check_item", args={"item_id": asked})
            add("assistant_message", f"Looking {asked} up.", tool_calls=(check,))
            add("tool_outcome", json.dumps({"item_id": asked, "found": True}), call_id=check.call_id)
    add("assistant_message", "The pick list is done.")
    return lines


def _item(n: int, items: int) -> str:
    return f"sku-{(n * _ITEM_STRIDE) % items:04d}"


def _bin(step: int) -> str:
    # Unique per move (the stride is co-prime with _BINS): no bin is ever named twice.
    code = (step * _BIN_STRIDE + 41) % _BINS
    return f"BIN-{code // 100:02d}-{code % 100:02d}"
