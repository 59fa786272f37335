"""A prepared context's reply bytes, its messages and blocks written once each. Pure.

A thread's view memo hands the same message and wire block objects to every prepare until their
records change (``services/core/view_memo.py``); serialized whole on every prepare, the reply at 500
records is 165 KB of JSON, 0.4 of its 0.6 ms the messages. ``PreparedJson`` writes
the reply as pydantic would — the fields before the messages, each message, the tools, each block,
then the fields after the blocks — and keeps each message's and block's JSON by object identity.

Invariants:

1. The bytes equal ``reply_json(prepared)``, byte for byte: every part is the same field's dump with
   the same options, in the model's field order (a unit test holds the two to one another).
2. A fragment is found only for the very object it was written from: the entry holds that object, so
   its ``id`` cannot name another one while the entry lives, and every wire model is frozen.
3. Bounded by bytes: two generations; when the current one exceeds half the bound it becomes the
   older one and the one before is dropped. A fragment used again moves to the current generation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import BaseModel

from contracts import PreparedContext

__all__ = ["DEFAULT_REPLY_CACHE_BYTES", "PreparedJson"]

DEFAULT_REPLY_CACHE_BYTES = 32 * 1024 * 1024

_M = TypeVar("_M", bound=BaseModel)
_FIELDS = tuple(PreparedContext.model_fields)
_AT = _FIELDS.index("messages")
assert _FIELDS[_AT : _AT + 3] == ("messages", "tools", "blocks"), "the reply's spliced fields moved"
_HEAD = set(_FIELDS[:_AT])
_TAIL = set(_FIELDS[_AT + 3 :])
# A fragment's bytes beyond its text: the entry and its key.
_ENTRY_OVERHEAD = 200


def _entry_bytes(text: bytes) -> int:
    """An entry's estimate: its JSON, and as much again for the object it holds (a message's content is
    about as long as its JSON). Counted even when a view memo holds the same object: the cache may
    keep it alive after the memo let it go (the memory benchmark measured ~2× the JSON alone)."""
    return _ENTRY_OVERHEAD + 2 * len(text)


def _json(model: BaseModel, include: set[str] | None = None) -> bytes:
    # ``model_dump_json`` is this, decoded: the bytes are what goes out, and encoding a reply with any
    # non-ASCII character again cost more than writing it (0.17 ms for 165 KB).
    return model.__pydantic_serializer__.to_json(model, exclude_none=True, include=include)


class PreparedJson:
    """Writes replies of prepared contexts, reusing what it wrote of the same messages and blocks."""

    __slots__ = ("max_bytes", "_current", "_older", "_current_bytes", "_older_bytes", "hits", "misses")

    def __init__(self, max_bytes: int = DEFAULT_REPLY_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._current: dict[int, tuple[BaseModel, bytes]] = {}
        self._older: dict[int, tuple[BaseModel, bytes]] = {}
        self._current_bytes = 0
        self._older_bytes = 0
        self.hits = 0
        self.misses = 0

    def __call__(self, prepared: PreparedContext) -> bytes:
        """``reply_json(prepared)``, with the fragments written before taken as they are; the same
        context (a view's memo answers an unchanged view with the context it assembled) written once."""
        self.hits += 1
        found = self._current.get(id(prepared))
        if found is None:
            found = self._taken(prepared, self._written)
        return found[1]

    def _written(self, prepared: PreparedContext) -> bytes:
        head = _json(prepared, include=_HEAD)
        tail = _json(prepared, include=_TAIL)
        return b"".join(
            (
                head[:-1],
                b',"messages":[',
                self._joined(prepared.messages),
                b'],"tools":[',
                # A request's own tools are new objects on every request: written, never kept.
                b",".join([_json(t) for t in prepared.tools]),
                b'],"blocks":[',
                self._joined(prepared.blocks),
                b"],",
                tail[1:],
            )
        )

    @property
    def held_bytes(self) -> int:
        """Estimated bytes both generations hold."""
        return self._current_bytes + self._older_bytes

    def _joined(self, models: Sequence[BaseModel]) -> bytes:
        current = self._current
        texts = []
        for model in models:
            # Keyed by ``id``: the entry holds the object, so no other live object has its id
            # (invariant 2).
            found = current.get(id(model))
            if found is None:
                found = self._taken(model, _json)
                current = self._current  # a turn replaces the current generation
            texts.append(found[1])
        self.hits += len(models)
        return b",".join(texts)

    def _taken(self, model: _M, write: Callable[[_M], bytes]) -> tuple[BaseModel, bytes]:
        """``model``'s entry, from the older generation or written now, put in the current one."""
        key = id(model)
        found = self._older.pop(key, None)
        if found is not None:
            self._older_bytes -= _entry_bytes(found[1])
        else:
            self.hits -= 1  # counted with the others by the caller
            self.misses += 1
            found = (model, write(model))
        if self._current_bytes > self.max_bytes // 2:
            # The current generation becomes the older one; the one before is dropped (invariant 3).
            self._older, self._older_bytes = self._current, self._current_bytes
            self._current, self._current_bytes = {}, 0
        self._current[key] = found
        self._current_bytes += _entry_bytes(found[1])
        return found
