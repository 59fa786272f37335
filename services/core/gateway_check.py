"""The gateway's final check of a provider request against the context it was prepared from. Pure.

Checks, in order (design D5.8):

1. Every protected block is in the request, byte-identical (its units' hash is the manifest's) and
   in manifest order; otherwise ``ProtectedBlockAltered`` says which block and how: ``missing``,
   ``changed``, ``reordered``, or ``downgraded`` (its text is there, with another role or place).
2. What else the request holds is either a unit of the prepared request (optional blocks may be kept
   or left out) or an addition: a text unit, outside the instruction position, in a user message
   (or, for ``guidance`` only, a later system/developer message), labelled with its source and a
   category that source was granted; otherwise ``AdditionRefused``.
3. The request is counted with the prepare's counter: over the input budget → ``ContextBudgetExceeded``;
   from under the policy's soft limit (its compaction trigger) to at or over it, with additions, and
   for the first time for this context → ``context_reprepare_required``; else ``ok``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, assert_never, cast

from pydantic import BaseModel, ConfigDict, JsonValue

from contracts import GatewayAddition, PreparedContext, ProtectedBlock, RequestFormat
from contracts.hooks import AdditionCategory
from services.core.hashing import canonical_json, sha256_hex
from services.core.protected import (
    RequestUnit,
    block_hash,
    instruction_lengths,
    prepared_units,
    request_units,
)
from services.core.request_count import count_request
from services.errors import AdditionRefused, ContextBudgetExceeded, ProtectedBlockAltered

if TYPE_CHECKING:
    from services.core.tokens import TokenCounter

__all__ = [
    "CheckInputs",
    "Count",
    "GatewayRecord",
    "StoredUnit",
    "Verdict",
    "count_body",
    "gateway_record",
    "verify_final",
]

Count = Callable[[str], int]
# OpenAI's chat framing, applied to every unit of the formats without a published recipe.
_PER_UNIT = 3
_PRIMING = 3
# Keys that frame a unit rather than carry what the model reads.
_FRAMING_KEYS = frozenset({"type", "role", "cache_control"})


class StoredUnit(BaseModel):
    """A unit of the prepared request as the check needs it: its block and digests, not its content."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_id: str | None
    digest: str
    # sha256 of the unit's text (protected units only): finds a block that kept its words in another role.
    text_digest: str | None = None


class GatewayRecord(BaseModel):
    """What the fleet keeps of a prepared context to check its final request (keyed by id and format)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prepared_id: str
    format: RequestFormat
    tenant: str
    session_id: str
    thread_id: str
    policy: str
    input_budget: int
    # The prepared request counted as the check counts final ones: the baseline of "crossing".
    prepared_tokens: int
    # "o200k_base" / "cl100k_base"; ``None`` for the bytes/4 estimate.
    encoding: str | None
    carried_from: str | None = None
    manifest: tuple[ProtectedBlock, ...]
    units: tuple[StoredUnit, ...]
    instruction_lengths: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class CheckInputs:
    """A final request and what the fleet knows around it."""

    body: Mapping[str, JsonValue]
    additions: Sequence[GatewayAddition]
    # Per hook source (``name@version``), the categories the session's release granted it.
    grants: Mapping[str, frozenset[AdditionCategory]]
    # The policy's compaction trigger in tokens; ``None`` when that trigger is off.
    soft_limit: int | None
    # This context was re-prepared once already (or answered ``context_reprepare_required`` before).
    reprepared: bool


@dataclass(frozen=True, slots=True)
class Verdict:
    """A sendable request, or one to prepare again once."""

    outcome: Literal["ok", "context_reprepare_required"]
    final_tokens: int
    remaining: int
    request_sha256: str
    # One per added unit, in request order: the addition that labels it.
    additions: tuple[GatewayAddition, ...]


def gateway_record(
    prepared: PreparedContext, tenant: str, count: Count, encoding: str | None
) -> GatewayRecord:
    """What to keep of ``prepared`` so a final request can be checked against it."""
    protected = {m.block_id for m in prepared.protected_block_manifest}
    units = tuple(
        StoredUnit(
            block_id=u.block_id,
            digest=u.unit.digest,
            text_digest=_text_digest(u.unit) if u.block_id in protected else None,
        )
        for u in prepared_units(prepared)
    )
    body = prepared.request if prepared.request is not None else _chat_body(prepared)
    return GatewayRecord(
        prepared_id=prepared.prepared_id,
        format=prepared.format,
        tenant=tenant,
        session_id=prepared.session_id,
        thread_id=f"{prepared.run_id}.{prepared.instance_id}",
        policy=prepared.policy,
        input_budget=prepared.budget_report.input_budget,
        prepared_tokens=count_body(prepared.format, body, count),
        encoding=encoding,
        carried_from=None,
        manifest=prepared.protected_block_manifest,
        units=units,
        instruction_lengths=instruction_lengths(prepared),
    )


def verify_final(record: GatewayRecord, inputs: CheckInputs, count: Count) -> Verdict:
    """The verdict on a final request; raises the typed error of the first check it fails."""
    final = request_units(record.format, inputs.body, record.instruction_lengths)
    matched = _match_protected(record, final, inputs.additions)
    added = _additions(record, final, matched, inputs)
    tokens = count_body(record.format, inputs.body, count)
    if tokens > record.input_budget:
        err = ContextBudgetExceeded(
            tokens,
            record.input_budget,
            [{"kind": "final_request", "id": record.prepared_id, "tokens": tokens}],
        )
        err.details.update(prepared_tokens=record.prepared_tokens, stage="gateway")
        raise err
    soft = inputs.soft_limit
    crossed = soft is not None and record.prepared_tokens < soft <= tokens
    outcome: Literal["ok", "context_reprepare_required"] = (
        "context_reprepare_required" if crossed and added and not inputs.reprepared else "ok"
    )
    return Verdict(
        outcome=outcome,
        final_tokens=tokens,
        remaining=record.input_budget - tokens,
        request_sha256=sha256_hex(canonical_json(dict(inputs.body))),
        additions=added,
    )


def count_body(format: RequestFormat, body: Mapping[str, JsonValue], count: Count) -> int:
    """Tokens of a provider body: Chat by the prepare's recipe (``request_count``); the other formats
    by the same framing per unit over every string the model reads, and the tools array as JSON."""
    tools = body.get("tools")
    tool_list = tools if isinstance(tools, list) else []
    match format:
        case "openai.chat":
            messages = body.get("messages")
            rows = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
            # ``count_request`` only calls ``count``: the bytes/4 estimate stands in for a tokenizer.
            counter = cast("TokenCounter", _Counter(count))
            return count_request(rows, [t for t in tool_list if isinstance(t, dict)], counter)
        case "openai.responses" | "anthropic.messages":
            total = _PRIMING
            for unit in request_units(format, body, ()):
                total += _PER_UNIT + sum(count(s) for s in _strings(unit.value))
            if tool_list:
                total += count(json.dumps(tool_list, ensure_ascii=False, separators=(",", ":")))
            return total
        case _:
            assert_never(format)


class _Counter:
    """``count_request`` takes a TokenCounter; the check's count may be the bytes/4 estimate."""

    def __init__(self, count: Count) -> None:
        self.count = count


def _strings(value: JsonValue, key: str | None = None) -> list[str]:
    if isinstance(value, str):
        return [] if key in _FRAMING_KEYS else [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, k)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _chat_body(prepared: PreparedContext) -> dict[str, JsonValue]:
    tools: list[JsonValue] = [t.model_dump(mode="json") for t in prepared.tools]
    return {"messages": list(prepared.openai_messages()), "tools": tools}


def _text_digest(unit: RequestUnit) -> str | None:
    return sha256_hex(unit.text.encode()) if unit.text is not None else None


def _match_protected(
    record: GatewayRecord, final: Sequence[RequestUnit], additions: Sequence[GatewayAddition]
) -> set[int]:
    """The positions of ``final`` that are protected blocks, each block found whole and in order."""
    digests = [u.digest for u in final]
    matched: set[int] = set()
    cursor = 0
    for block in record.manifest:
        own = [u for u in record.units if u.block_id == block.block_id]
        wanted = [u.digest for u in own]
        at = _find_run(digests, wanted, cursor)
        if at is None:
            earlier = _find_run(digests, wanted, 0)
            if earlier is not None:
                raise ProtectedBlockAltered(
                    record.prepared_id,
                    block.block_id,
                    "reordered",
                    f"found at unit {earlier}, before unit {cursor}",
                )
            known = {u.digest for u in record.units}
            how, detail = _why_absent(own, final, cursor, matched, additions, known)
            raise ProtectedBlockAltered(record.prepared_id, block.block_id, how, detail)
        run = final[at : at + len(wanted)]
        # The digests matched; the manifest's hash is the contract a client recomputes.
        if block_hash(run) != block.sha256:
            raise ProtectedBlockAltered(record.prepared_id, block.block_id, "changed", "its hash differs")
        matched.update(range(at, at + len(wanted)))
        cursor = at + len(wanted)
    return matched


def _optional(record: GatewayRecord) -> Counter[str]:
    """The digests of the prepared units outside protected blocks (optional blocks, framing)."""
    protected = {m.block_id for m in record.manifest}
    return Counter(u.digest for u in record.units if u.block_id not in protected)


def _find_run(digests: Sequence[str], wanted: Sequence[str], start: int) -> int | None:
    if not wanted:
        return start
    for at in range(start, len(digests) - len(wanted) + 1):
        if digests[at : at + len(wanted)] == list(wanted):
            return at
    return None


def _why_absent(
    own: Sequence[StoredUnit],
    final: Sequence[RequestUnit],
    cursor: int,
    matched: set[int],
    additions: Sequence[GatewayAddition],
    known: set[str],
) -> tuple[str, str]:
    """Why a block is not in the request: its words elsewhere (downgraded), something unknown in its
    place (changed), or nothing (missing)."""
    texts = [u.text_digest for u in own]
    present = [_text_digest(u) for n, u in enumerate(final) if n not in matched]
    if all(t is not None for t in texts) and _in_order(texts, present):
        return "downgraded", "its text is there with another role or in another place"
    labelled = {a.text for a in additions}
    edited = any(
        n not in matched and u.digest not in known and u.text not in labelled
        for n, u in enumerate(final)
        if n >= cursor
    )
    if edited:
        return "changed", f"its units are not in the request after unit {cursor}; others are in their place"
    return "missing", "none of its units is in the request"


def _in_order(wanted: Sequence[str | None], present: Sequence[str | None]) -> bool:
    it = iter(present)
    return all(any(p == w for p in it) for w in wanted)


def _additions(
    record: GatewayRecord, final: Sequence[RequestUnit], matched: set[int], inputs: CheckInputs
) -> tuple[GatewayAddition, ...]:
    """The labelled additions of the units neither protected nor kept from the prepared request."""
    optional = _optional(record)
    by_text = {a.text: a for a in inputs.additions}
    found: list[GatewayAddition] = []
    for n, unit in enumerate(final):
        if n in matched:
            continue
        if optional[unit.digest] > 0:
            optional[unit.digest] -= 1
            continue
        found.append(_labelled(record.prepared_id, n, unit, by_text, inputs.grants))
    return tuple(found)


def _labelled(
    prepared_id: str,
    position: int,
    unit: RequestUnit,
    by_text: Mapping[str, GatewayAddition],
    grants: Mapping[str, frozenset[AdditionCategory]],
) -> GatewayAddition:
    if unit.text is None:
        raise AdditionRefused(
            prepared_id, "not_text", position, "only text may be added (no tool calls or results)"
        )
    if unit.leading:
        raise AdditionRefused(
            prepared_id,
            "instruction_position",
            position,
            "added text would read as the release's instructions",
        )
    addition = by_text.get(unit.text)
    if addition is None:
        raise AdditionRefused(
            prepared_id, "unlabelled", position, "no addition names this text and its source"
        )
    granted = grants.get(addition.source)
    if granted is None:
        raise AdditionRefused(
            prepared_id,
            "unknown_source",
            position,
            f"{addition.source} is no hook of the session's release",
            source=addition.source,
        )
    if addition.category not in granted:
        raise AdditionRefused(
            prepared_id,
            "ungranted_category",
            position,
            f"{addition.source} was not granted {addition.category.value}",
            source=addition.source,
            category=addition.category.value,
        )
    if unit.role not in _ROLES[addition.category]:
        raise AdditionRefused(
            prepared_id,
            "role",
            position,
            f"{addition.category.value} may not be added as a {unit.role!r} message",
            source=addition.source,
        )
    return addition


# Material is quoted, so it is the user's side of the conversation; guidance may be a later system
# note too (never the leading instructions). Neither may speak as the model or as a tool.
_ROLES: Mapping[AdditionCategory, frozenset[str]] = {
    AdditionCategory.MATERIAL: frozenset({"user"}),
    AdditionCategory.GUIDANCE: frozenset({"user", "system", "developer"}),
}
