"""The read-side record: what the assembler needs of one ledger record, typed per kind.

A record's kind is the wire's :class:`~contracts.EventKind` and its body the wire's payload model
of that kind (``contracts/events.py``), with the record's text. The body is parsed once, when the
record is built from its row; the view loader caches records per thread, so no prepare parses again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeAlias

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
    UserInputPayload,
)

from services.core.tokens import EncodingName

__all__ = [
    "LedgerRecord",
    "RecordBody",
    "TokenCounts",
    "ascending_by_seq",
    "parse_body",
]


class TokenCounts:
    """Tokens of one piece of content in every supported encoding.

    ``cl100k_base`` may be given as a function that counts it: the recorder counts only o200k (what
    the default profiles and every estimate use), and the cl100k count is made on first use by a
    profile that needs it, then kept. Immutable, compared and hashed by both counts.
    """

    __slots__ = ("o200k_base", "_cl100k", "_count_cl100k")

    o200k_base: int
    _cl100k: int | None
    _count_cl100k: Callable[[], int] | None

    def __init__(self, o200k_base: int, cl100k_base: int | Callable[[], int]) -> None:
        object.__setattr__(self, "o200k_base", o200k_base)
        if callable(cl100k_base):
            object.__setattr__(self, "_cl100k", None)
            object.__setattr__(self, "_count_cl100k", cl100k_base)
        else:
            object.__setattr__(self, "_cl100k", cl100k_base)
            object.__setattr__(self, "_count_cl100k", None)

    @property
    def cl100k_base(self) -> int:
        """Tokens in cl100k_base, counted now if they were not yet."""
        if self._cl100k is None:
            assert self._count_cl100k is not None
            object.__setattr__(self, "_cl100k", self._count_cl100k())
            object.__setattr__(self, "_count_cl100k", None)
        assert self._cl100k is not None
        return self._cl100k

    @property
    def cl100k_counted(self) -> int | None:
        """The cl100k count if it was made, without making it (what the recorder stores)."""
        return self._cl100k

    def get(self, encoding: EncodingName) -> int:
        return self.o200k_base if encoding == "o200k_base" else self.cl100k_base

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"TokenCounts is immutable (cannot set {name})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenCounts):
            return NotImplemented
        return self.o200k_base == other.o200k_base and self.cl100k_base == other.cl100k_base

    def __hash__(self) -> int:
        return hash((self.o200k_base, self.cl100k_base))

    def __repr__(self) -> str:
        # Never counts: a log line or a failed assertion must not pay for (or hide) a deferred count.
        cl100k = "<not counted>" if self._cl100k is None else self._cl100k
        return f"TokenCounts(o200k_base={self.o200k_base}, cl100k_base={cl100k})"

    def __reduce__(self) -> tuple[type[TokenCounts], tuple[int, int]]:
        # copy and pickle rebuild it through __init__ (slots and a blocked __setattr__ need that).
        return (TokenCounts, (self.o200k_base, self.cl100k_base))


RecordBody: TypeAlias = (
    SystemPayload
    | UserInputPayload
    | AssistantMessagePayload
    | ToolOutcomePayload
    | ResourceActivatedPayload
    | ChildResultPayload
    | RunStatusPayload
    | ContextExportPayload
    | ContextResetPayload
    | StatePatchPayload
    | OperationReconcilePayload
    | PhaseChangePayload
)

_BODIES: dict[EventKind, type[RecordBody]] = {
    EventKind.SYSTEM: SystemPayload,
    EventKind.USER_INPUT: UserInputPayload,
    EventKind.ASSISTANT_MESSAGE: AssistantMessagePayload,
    EventKind.TOOL_OUTCOME: ToolOutcomePayload,
    EventKind.RESOURCE_ACTIVATED: ResourceActivatedPayload,
    EventKind.CHILD_RESULT: ChildResultPayload,
    EventKind.RUN_STATUS: RunStatusPayload,
    EventKind.CONTEXT_EXPORT: ContextExportPayload,
    EventKind.CONTEXT_RESET: ContextResetPayload,
    EventKind.STATE_PATCH: StatePatchPayload,
    EventKind.OPERATION_RECONCILE: OperationReconcilePayload,
    EventKind.PHASE_CHANGE: PhaseChangePayload,
}


def ascending_by_seq(records: Iterable[LedgerRecord]) -> bool:
    return all(a.seq < b.seq for a, b in itertools.pairwise(records))


_FIELDS = {kind: frozenset(model.model_fields) for kind, model in _BODIES.items()}


def parse_body(kind: EventKind, p: Mapping[str, JsonValue], text: str = "") -> RecordBody:
    """The wire payload of a stored one (the recorder's ``model_dump(mode="json")``, its ``text``
    stored apart and given here). Keys the payload model does not know (``_resolved``) are not read."""
    fields = _FIELDS[kind]
    data = dict(p) if p.keys() <= fields else {k: v for k, v in p.items() if k in fields}
    if "text" in fields:
        data["text"] = text
    return _BODIES[kind].model_validate(data)


@dataclass(frozen=True, slots=True)
class LedgerRecord:
    """A record as the assembler reads it: model-visible text and the tokens counted at recording.

    ``payload`` is the stored JSON as the recorder wrote it; ``body`` is the same, typed, derived
    from it at construction (``dataclasses.replace`` derives it again, so the two never disagree).
    """

    seq: int
    event_key: str
    kind: EventKind
    payload: Mapping[str, JsonValue]
    text: str
    tokens: TokenCounts
    # A short preview of a long tool output and its tokens, shown when the hot path must shed tokens.
    mask_text: str | None = None
    mask_tokens: TokenCounts | None = None
    # Which thread wrote it, and its seq there; a view orders records by ``seq`` = session seq.
    thread_id: str = ""
    thread_seq: int = 0
    # When the fleet recorded it (its clock, ``recorded_at``); not part of what a model sees.
    recorded_at: datetime | None = field(default=None, compare=False)
    body: RecordBody = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Frozen: the derived fields are set once, here. A kind given as its string value is accepted.
        kind = EventKind(self.kind)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "body", parse_body(kind, self.payload, self.text))
