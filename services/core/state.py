"""State as a deterministic projection of the ledger: facts with provenance and supersession. Pure.

Rules (docs/design.md, "State"), one function each:

1. Only registered paths are written (``_rule_for``).
2. Who may write is the authority matrix (docs/design.md, "Who may write what"); a model can only
   propose (``_authority``).
3. A patch names the aggregate versions it was based on; a moved aggregate refuses it (``_check_versions``).
4. Operations keep their invariants: increment needs a number, append/remove a list, replace_if the
   expected current value (``_apply_op``).
5. A newer fact about a key supersedes the older one explicitly; a write observed *before* the current
   fact from a source of equal rank marks the key conflicted, never last-write-wins (``_supersede``).
6. UNKNOWN is a value: a failed, timed-out or unknown tool outcome makes its declared paths UNKNOWN.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import JsonValue

from contracts import (
    AssistantMessagePayload,
    EventKind,
    PatchOp,
    PathRule,
    StatePatchPayload,
    ToolCatalog,
    ToolOutcomePayload,
    ToolSpec,
)

from contracts.exceptions import (
    AuthorityViolation,
    InvalidEvent,
    InvariantViolation,
    StaleStateVersion,
    UnregisteredPath,
)
from services.core.hashing import canonical_json, sha256_hex
from services.core.records import RecordBody, parse_body

__all__ = [
    "AUTHORITY",
    "PLAN_TRANSITIONS",
    "Fact",
    "StateView",
    "StateWrite",
    "aggregate_of",
    "effects_of",
    "pattern_regex",
    "plan_patch",
    "rebuild_state",
    "record_write",
    "render_facts",
    "state_hash",
    "tool_spec",
]

_Verdict = Literal["commit", "proposal", "deny"]
# The authority matrix (docs/design.md, "Who may write what"). "Confirmation" (a user on a business fact)
# commits; "Proposal" is recorded, not applied.
_SOURCES = ("tool_effect", "user", "model_proposal", "orchestrator")
_MATRIX: Mapping[str, tuple[_Verdict, _Verdict, _Verdict, _Verdict]] = {
    "tool_fact": ("commit", "deny", "deny", "commit"),
    "goal": ("deny", "commit", "proposal", "commit"),
    "preference": ("deny", "commit", "proposal", "commit"),
    "business_fact": ("commit", "commit", "deny", "commit"),
    "plan": ("proposal", "commit", "commit", "commit"),
    "open_question": ("proposal", "commit", "commit", "commit"),
    "audit": ("deny", "deny", "deny", "commit"),
    # Constraints keep the user's own words; a model may suggest one, never impose it.
    "constraint": ("deny", "commit", "proposal", "commit"),
    "decision": ("proposal", "commit", "commit", "commit"),
}
# Per path kind, per source (the columns of ``_MATRIX``, in ``_SOURCES`` order).
AUTHORITY: Mapping[str, Mapping[str, _Verdict]] = {
    kind: dict(zip(_SOURCES, row, strict=True)) for kind, row in _MATRIX.items()
}
# The plan lifecycle: where a plan's status may go from where it is.
PLAN_TRANSITIONS: Mapping[str | None, frozenset[str]] = {
    None: frozenset({"proposed"}),
    "proposed": frozenset({"accepted", "cancelled"}),
    "accepted": frozenset({"executing", "cancelled"}),
    "executing": frozenset({"blocked", "completed", "cancelled"}),
    "blocked": frozenset({"executing", "cancelled"}),
    "completed": frozenset(),
    "cancelled": frozenset(),
}
_RANK = {"tool_effect": 2, "orchestrator": 2, "user": 1, "model_proposal": 0}
_TEMPLATE = re.compile(r"\{(args|result)\.([A-Za-z0-9_]+)\}")


@dataclass(frozen=True, slots=True)
class Fact:
    """One value of one path, with where it came from and what it replaced."""

    path: str
    value: JsonValue
    status: Literal["known", "unknown", "stale", "conflicted"]
    source: str
    event_key: str
    seq: int
    observed_at: str | None
    supersedes: str | None = None
    superseded_value: JsonValue = None
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StateWrite:
    """What one accepted patch (or tool effect) does: new facts and aggregate version bumps."""

    facts: tuple[Fact, ...]
    versions: Mapping[str, int]
    proposal: bool = False


@dataclass
class StateView:
    """The current state of a thread: current facts by path, aggregate versions."""

    facts: dict[str, Fact] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)

    def apply(self, write: StateWrite) -> None:
        """Evolve by one accepted write (proposals change nothing)."""
        if write.proposal:
            return
        for fact in write.facts:
            self.facts[fact.path] = fact
        self.versions.update(write.versions)


def aggregate_of(path: str) -> str:
    """``item:42`` of ``item:42.location``."""
    return path.split(".", 1)[0]


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A registered pattern (``item:{id}.location``) as a regex over concrete paths."""
    parts = re.split(r"(\{[A-Za-z0-9_]+\})", pattern)
    return re.compile(
        "^" + "".join("[A-Za-z0-9_\\-]+" if p.startswith("{") else re.escape(p) for p in parts) + "$"
    )


def _rule_for(path: str, rules: Sequence[PathRule]) -> PathRule:
    for rule in rules:
        if pattern_regex(rule.pattern).match(path):
            return rule
    raise UnregisteredPath(path)


def _authority(rule: PathRule, source: str) -> _Verdict:
    verdict = AUTHORITY[rule.kind][source]
    if verdict == "deny":
        raise AuthorityViolation(rule.pattern, rule.kind, source)
    return verdict


def _check_versions(state: StateView, based_on: Mapping[str, int], aggregates: Iterable[str]) -> None:
    for aggregate in aggregates:
        current = state.versions.get(aggregate, 0)
        expected = based_on.get(aggregate, current)
        if expected != current:
            raise StaleStateVersion(aggregate, expected, current)


def _check_plan_transition(op: PatchOp, current: Fact | None) -> None:
    before = current.value if current is not None and isinstance(current.value, str) else None
    after = op.value if isinstance(op.value, str) else None
    allowed = PLAN_TRANSITIONS.get(before, frozenset())
    if op.op != "set" or after not in allowed:
        raise InvariantViolation(op.path, f"plan status cannot go from {before or 'nothing'} to {op.value!r}")


def _apply_op(op: PatchOp, current: Fact | None, kind: str = "") -> tuple[JsonValue, bool]:
    """The new value of the path and whether it is UNKNOWN."""
    if kind == "plan" and op.path.endswith(".status"):
        _check_plan_transition(op, current)
    if op.unknown:
        return None, True
    if op.stale:
        if current is None:
            raise InvariantViolation(op.path, "only a recorded fact can be marked stale")
        return current.value, False
    now = current.value if current is not None and current.status != "unknown" else None
    match op.op:
        case "set":
            return op.value, False
        case "clear":
            return None, False
        case "append":
            if now is not None and not isinstance(now, list):
                raise InvariantViolation(op.path, "append needs a list")
            return [*(now or []), op.value], False
        case "remove":
            if not isinstance(now, list) or op.value not in now:
                raise InvariantViolation(op.path, "remove needs a list holding the value")
            return [v for v in now if v != op.value], False
        case "increment":
            step = op.value if op.value is not None else 1
            if not isinstance(step, (int, float)) or (now is not None and not isinstance(now, (int, float))):
                raise InvariantViolation(op.path, "increment needs numbers")
            return (now or 0) + step, False
        case "replace_if":
            if now != op.expected:
                raise InvariantViolation(op.path, f"replace_if expected {op.expected!r}, found {now!r}")
            return op.value, False


def _supersede(
    path: str,
    value: JsonValue,
    unknown: bool,
    source: str,
    event_key: str,
    seq: int,
    observed_at: str | None,
    current: Fact | None,
) -> Fact:
    status: Literal["known", "unknown", "conflicted"] = "unknown" if unknown else "known"
    if current is None:
        return Fact(path, value, status, source, event_key, seq, observed_at)
    older = observed_at is not None and current.observed_at is not None and observed_at < current.observed_at
    if older and _RANK[source] == _RANK[current.source] and current.value != value and not unknown:
        # Same rank, arriving late with an older observation: neither wins silently.
        return replace(current, status="conflicted", supersedes=event_key, superseded_value=value)
    return Fact(path, value, status, source, event_key, seq, observed_at, current.event_key, current.value)


def plan_patch(
    state: StateView,
    ops: Sequence[PatchOp],
    *,
    source: str,
    based_on: Mapping[str, int],
    rules: Sequence[PathRule],
    event_key: str,
    seq: int,
    observed_at: str | None,
    evidence: Sequence[str] = (),
) -> StateWrite:
    """Validate a patch against the state and decide its facts; raises a typed InvalidEvent."""
    kinds = [_rule_for(op.path, rules) for op in ops]
    verdicts = [_authority(rule, source) for rule in kinds]
    aggregates = sorted({aggregate_of(op.path) for op in ops})
    _check_versions(state, based_on, aggregates)
    proposal = any(v == "proposal" for v in verdicts)
    scratch = dict(state.facts)
    facts: list[Fact] = []
    for op, rule in zip(ops, kinds, strict=True):
        current = scratch.get(op.path)
        value, unknown = _apply_op(op, current, rule.kind)
        fact = _supersede(op.path, value, unknown, source, event_key, seq, observed_at, current)
        if op.stale:
            fact = replace(fact, status="stale")
        fact = replace(fact, evidence=tuple(evidence))
        scratch[op.path] = fact
        facts.append(fact)
    versions = {a: state.versions.get(a, 0) + 1 for a in aggregates}
    return StateWrite(tuple(facts), {} if proposal else versions, proposal)


def _fill(
    template: str, args: Mapping[str, JsonValue], result: Mapping[str, JsonValue] | None
) -> JsonValue | None:
    whole = _TEMPLATE.fullmatch(template)
    if whole:
        source = args if whole.group(1) == "args" else (result or {})
        return source.get(whole.group(2))
    missing = False

    def sub(m: re.Match[str]) -> str:
        nonlocal missing
        source = args if m.group(1) == "args" else (result or {})
        value = source.get(m.group(2))
        if value is None:
            missing = True
            return ""
        return str(value)

    text = _TEMPLATE.sub(sub, template)
    return None if missing else text


def effects_of(spec: ToolSpec, args: Mapping[str, JsonValue], status: str, text: str) -> list[PatchOp]:
    """The patch a tool outcome makes through its declared effects (code, not the model's words)."""
    result: Mapping[str, JsonValue] | None = None
    if status == "success":
        try:
            parsed = json.loads(text)
            result = parsed if isinstance(parsed, dict) else None
        except ValueError:
            result = None
    ops: list[PatchOp] = []
    for effect in spec.effects:
        path = _fill(effect.path, args, result)
        if not isinstance(path, str) or not path:
            continue
        if status != "success":
            ops.append(PatchOp(op="set", path=path, unknown=True))
            continue
        value = _fill(effect.value, args, result) if effect.value else None
        if isinstance(value, str) and not _TEMPLATE.search(effect.value):
            # A literal in the catalog ("1", "true", "[]") is JSON; anything else stays text.
            try:
                value = json.loads(value)
            except ValueError:
                pass
        if effect.op == "set" and value is None:
            continue
        ops.append(PatchOp(op=effect.op, path=path, value=value))
    return ops


def render_facts(facts: Iterable[Fact]) -> str:
    """The state block as the model reads it: current values first, each with status and source."""
    lines = ["[state: current facts — each is the latest recorded value; superseded values are history]"]
    for fact in sorted(facts, key=lambda f: f.path):
        value = "UNKNOWN" if fact.status == "unknown" else json.dumps(fact.value, ensure_ascii=False)
        line = (
            f"- {fact.path} = {value} ({fact.status.upper() if fact.status != 'known' else 'CURRENT'}, "
            f"source {fact.event_key})"
        )
        if fact.status == "stale":
            line += "; may no longer hold — check before relying on it"
        if fact.supersedes is not None and fact.status != "conflicted":
            line += (
                f"; supersedes {json.dumps(fact.superseded_value, ensure_ascii=False)} from {fact.supersedes}"
            )
        if fact.status == "conflicted":
            line += (
                f"; conflicts with {json.dumps(fact.superseded_value, ensure_ascii=False)} from "
                f"{fact.supersedes}"
            )
        lines.append(line)
    return "\n".join(lines)


def record_write(
    body: RecordBody,
    state: StateView,
    catalog: ToolCatalog | None,
    call: tuple[str, Mapping[str, JsonValue]] | None,
    *,
    event_key: str,
    seq: int,
    observed_at: str | None,
) -> tuple[StateWrite, tuple[PatchOp, ...]] | None:
    """The state change a record makes: its own typed patch, or the declared effects of the tool whose
    call (``call``: its name and arguments) it answers. A patch the rules refuse raises InvalidEvent."""
    rules = catalog.paths if catalog else ()
    if isinstance(body, StatePatchPayload):
        write = plan_patch(
            state,
            body.ops,
            source=body.source,
            based_on=body.based_on_version,
            rules=rules,
            event_key=event_key,
            seq=seq,
            observed_at=observed_at,
            evidence=body.evidence,
        )
        return write, body.ops
    if not isinstance(body, ToolOutcomePayload) or call is None:
        return None
    spec = tool_spec(catalog, call[0])
    ops = tuple(effects_of(spec, call[1], body.status.value, body.text)) if spec else ()
    if not ops:
        return None
    try:
        write = plan_patch(
            state,
            ops,
            source="tool_effect",
            based_on={},
            rules=rules,
            event_key=event_key,
            seq=seq,
            observed_at=observed_at,
            evidence=(f"call:{body.call_id}", event_key),
        )
    except InvalidEvent:
        # A catalog whose effect writes outside its own rules changes no state; the outcome
        # itself is still recorded — it happened.
        return None
    return write, ops


def rebuild_state(
    records: Iterable[tuple[int, str, str, Mapping[str, JsonValue], str, str | None]],
    catalog: ToolCatalog | None,
) -> StateView:
    """Replay a thread's records (seq, event key, kind, payload, full text, client time) into its state.

    The recorder wrote the same facts through the same function (``record_write``), so a stored
    projection that differs from this replay was changed outside the write path.
    """
    state = StateView()
    calls: dict[str, tuple[str, Mapping[str, JsonValue]]] = {}
    for seq, key, kind, payload, text, observed in records:
        body = parse_body(EventKind(kind), payload, text)
        if isinstance(body, AssistantMessagePayload):
            calls.update((c.call_id, (c.name, c.args)) for c in body.tool_calls)
        call = calls.get(body.call_id) if isinstance(body, ToolOutcomePayload) else None
        write = record_write(body, state, catalog, call, event_key=key, seq=seq, observed_at=observed)
        if write is not None:
            state.apply(write[0])
    return state


def state_hash(state: StateView) -> str:
    """A hash of the current state, to compare a stored projection with a replay."""
    body: dict[str, JsonValue] = {
        "facts": {
            p: [f.value, f.status, f.source, f.event_key, f.seq] for p, f in sorted(state.facts.items())
        },
        "versions": dict(sorted(state.versions.items())),
    }
    return sha256_hex(canonical_json(body))


def tool_spec(catalog: ToolCatalog | None, name: str) -> ToolSpec | None:
    if catalog is None:
        return None
    return next((t for t in catalog.tools if t.name == name), None)
