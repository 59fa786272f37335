"""The gateway's final check of a provider request against the context it was prepared from. Pure.

Checks, in order (docs/design.md, "The gateway's final check holds what is sent to what was prepared"):

1. Every protected block is in the request, byte-identical (its units' hash is the manifest's) and
   in manifest order; otherwise ``ProtectedBlockAltered`` says which block and how: ``missing``,
   ``changed``, ``reordered``, or ``downgraded`` (its text is there, with another role or place).
2. What else the request holds is either a unit of the prepared request (optional blocks may be kept
   or left out) or an addition: a text unit, outside the instruction position, in a user message
   (or, for ``guidance`` only, a later system/developer message), labelled with its source and a
   category that source was granted; otherwise ``AdditionRefused``.
3. The request is counted as the prepare counted it: the prepare's own figures for every block it
   kept whole, less the blocks it left out, plus the same tokenizer's count of each new unit (so a
   check tokenizes only what was added). Over the input budget → ``ContextBudgetExceeded``;
   from under the policy's soft limit (its compaction trigger) to at or over it, with additions, and
   for the first time for this context → ``context_reprepare_required``; else ``ok``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

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
from contracts.exceptions import AdditionRefused, ContextBudgetExceeded, ProtectedBlockAltered

__all__ = [
    "CheckInputs",
    "Count",
    "GatewayRecord",
    "StoredUnit",
    "Verdict",
    "unit_tokens",
    "gateway_record",
    "verify_final",
]

Count = Callable[[str], int]
# OpenAI's chat framing, applied to every unit of the formats without a published recipe.
_PER_UNIT = 3
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
    # The prepare's own count of what it sent (``budget_report.used.total``), per block and for the
    # tools array: a final request is counted as this, less what it left out, plus what it added.
    prepared_tokens: int
    block_tokens: dict[str, int]
    tool_tokens: int
    tools_digest: str
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


def gateway_record(prepared: PreparedContext, tenant: str, encoding: str | None) -> GatewayRecord:
    """What to keep of ``prepared`` so a final request can be checked against it (nothing is tokenized)."""
    protected = {m.block_id for m in prepared.protected_block_manifest}
    units = tuple(
        StoredUnit(
            block_id=u.block_id,
            digest=u.unit.digest,
            text_digest=_text_digest(u.unit) if u.block_id in protected else None,
        )
        for u in prepared_units(prepared)
    )
    # Only the tools of a Chat body are read here: its messages are hashed as units above.
    body = prepared.request if prepared.request is not None else _chat_tools(prepared)
    used = prepared.budget_report.used
    return GatewayRecord(
        prepared_id=prepared.prepared_id,
        format=prepared.format,
        tenant=tenant,
        session_id=prepared.session_id,
        thread_id=f"{prepared.run_id}.{prepared.instance_id}",
        policy=prepared.policy,
        input_budget=prepared.budget_report.input_budget,
        prepared_tokens=used.total,
        block_tokens={b.block_id: b.tokens for b in prepared.blocks},
        tool_tokens=used.tool_schemas,
        tools_digest=_tools_digest(body),
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
    kept = _kept_optional(record, final, matched)
    added = tuple(
        _labelled(record.prepared_id, n, unit, {a.text: a for a in inputs.additions}, inputs.grants)
        for n, unit in enumerate(final)
        if n not in matched and n not in kept
    )
    tokens = _final_tokens(record, final, matched, kept, inputs.body, count)
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


def _strings(value: JsonValue, key: str | None = None) -> list[str]:
    if isinstance(value, str):
        return [] if key in _FRAMING_KEYS else [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, k)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _chat_tools(prepared: PreparedContext) -> dict[str, JsonValue]:
    tools: list[JsonValue] = [t.model_dump(mode="json") for t in prepared.tools]
    return {"tools": tools}


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


def _kept_optional(
    record: GatewayRecord, final: Sequence[RequestUnit], matched: set[int]
) -> dict[int, str | None]:
    """The positions of ``final`` holding a prepared unit outside the protected blocks, with its block."""
    protected = {m.block_id for m in record.manifest}
    owners: dict[str, list[str | None]] = {}
    for u in record.units:
        if u.block_id not in protected:
            owners.setdefault(u.digest, []).append(u.block_id)
    kept: dict[int, str | None] = {}
    for n, unit in enumerate(final):
        if n not in matched and owners.get(unit.digest):
            kept[n] = owners[unit.digest].pop(0)
    return kept


def _final_tokens(
    record: GatewayRecord,
    final: Sequence[RequestUnit],
    matched: set[int],
    kept: Mapping[int, str | None],
    body: Mapping[str, JsonValue],
    count: Count,
) -> int:
    """The prepare's count, less the blocks left out (whole or in part), plus what is new.

    Unchanged blocks keep the count the prepare gave them, with the same arithmetic; only units the
    prepare did not send are tokenized, so a check costs what was added, not the whole request.
    """
    total = record.prepared_tokens
    units: Counter[str | None] = Counter(u.block_id for u in record.units)
    present = Counter(kept.values())
    partial = {b for b, n in units.items() if b is not None and b in record.block_tokens and present[b] < n}
    protected = {m.block_id for m in record.manifest}
    for block_id in partial - protected:
        total -= record.block_tokens[block_id]
    for n, unit in enumerate(final):
        if n in matched:
            continue
        owner = kept.get(n)
        if n not in kept or (owner in partial and owner not in protected):
            total += unit_tokens(unit, count)
    if _tools_digest(body) != record.tools_digest:
        total += _tools_tokens(body, count) - record.tool_tokens
    return total


def unit_tokens(unit: RequestUnit, count: Count) -> int:
    """A unit as the prepare counts a message: framing plus every string the model reads."""
    return _PER_UNIT + sum(count(s) for s in _strings(unit.value))


def _tools_of(body: Mapping[str, JsonValue]) -> list[JsonValue]:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return []
    return [{k: v for k, v in t.items() if k != "cache_control"} if isinstance(t, dict) else t for t in tools]


def _tools_digest(body: Mapping[str, JsonValue]) -> str:
    return sha256_hex(canonical_json(_tools_of(body)))


def _tools_tokens(body: Mapping[str, JsonValue], count: Count) -> int:
    tools = _tools_of(body)
    return count(json.dumps(tools, ensure_ascii=False, separators=(",", ":"))) if tools else 0


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
