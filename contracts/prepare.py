"""Prepare: a runtime's request for the context of its next model call, and the reply.

The reply, :class:`PreparedContext`, is the model input in OpenAI Chat Completions shape plus
everything needed to explain it: per block why it is there, where it came from, its priority
and whether it may be dropped, and an itemized budget report.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import (
    ConfigDict,
    Field,
    JsonValue,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

from ._base import SchemaVersion, WireModel, forbidden_shapes, is_none, none_omitted
from .forecasts import Forecast, ForecastDeclaration
from .ids import EventKeyStr, Identifier
from .task_budgets import TaskBudget, TaskBudgetReport
from .windows import RolloverReport, WaterLevel

__all__ = [
    "BlockKind",
    "BudgetCategory",
    "BudgetReport",
    "ChatFunction",
    "ChatMessage",
    "ChatTool",
    "RequestFormat",
    "ChatToolCall",
    "Authority",
    "ContextBlock",
    "EvidenceRef",
    "ModelProfile",
    "OmittedBlock",
    "PendingCall",
    "PrepareRequest",
    "HookTouch",
    "PreparedContext",
    "ProtectedBlock",
    "ProviderOverflow",
    "Purpose",
    "RecordRef",
    "ReductionCounts",
    "ReportedUsage",
    "Retention",
    "SourceWatermark",
    "SummaryHook",
    "SummaryRef",
    "ToolSchema",
    "WindowReport",
]


class Purpose(StrEnum):
    """Why the runtime is calling its model."""

    ACTION = "action"
    COMPACTION = "compaction"
    COMPLETION = "completion"


class ModelProfile(WireModel):
    """A model's limits: ``InputBudget = min(input_limit,
    context_window − output_reserve − safety_margin)``."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    context_window: Annotated[int, Field(gt=0)]
    input_limit: Annotated[int, Field(gt=0)] | None = None
    output_reserve: Annotated[int, Field(ge=0)] = 0
    safety_margin: Annotated[int, Field(ge=0)] = 0
    # "estimate" is for models whose tokenizer is not shipped: UTF-8 bytes / 4, labelled as an estimate.
    encoding: Literal["o200k_base", "cl100k_base", "estimate"] = "o200k_base"

    @model_validator(mode="after")
    def _leaves_room_for_input(self) -> ModelProfile:
        if self.context_window - self.output_reserve - self.safety_margin <= 0:
            raise ValueError("context_window must exceed output_reserve + safety_margin")
        return self

    @property
    def input_budget(self) -> int:
        """The tokens available to the prompt."""
        room = self.context_window - self.output_reserve - self.safety_margin
        return room if self.input_limit is None else min(self.input_limit, room)


class ToolSchema(WireModel):
    """A tool the model may call on this turn; counted against the budget and echoed back."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    description: str = ""
    parameters: dict[str, JsonValue] = Field(default_factory=dict)


class ReportedUsage(WireModel):
    """Provider usage of the model response recorded as ``response_event_key``.

    The next estimate is this usage plus local counts of what was recorded after that response,
    as long as the view is still the one the response was produced from (``view_revision``).
    """

    response_event_key: EventKeyStr
    input_tokens: Annotated[int, Field(ge=0)]
    output_tokens: Annotated[int, Field(ge=0)] = 0
    view_revision: Annotated[int, Field(ge=0)] = 0


class ProviderOverflow(WireModel):
    """The provider refused the last context as too long: what it said, and what we sent.

    Only an explicit context-length refusal is an overflow. An HTTP 413 (a proxy's body limit) or an
    unclassified error says nothing about tokens, so the model admits no other ``kind``: a runtime
    cannot report one, and the fleet never shrinks contexts on a guess.
    """

    kind: Literal["context_length_exceeded"]
    # The provider's window and its count of the refused request, when its error message gave them.
    provider_limit: Annotated[int, Field(gt=0)] | None = None
    provider_count: Annotated[int, Field(gt=0)] | None = None
    # The refused context's ``budget_report.estimated_input`` and ``view_revision``.
    our_estimate: Annotated[int, Field(gt=0)]
    view_revision: Annotated[int, Field(ge=0)]


class EvidenceRef(WireModel):
    """A record (typically a search hit) the runtime wants in this context, as quoted evidence."""

    thread_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,128}\.[A-Za-z0-9_-]{1,128}$")]
    seq: Annotated[int, Field(gt=0)]
    start_line: Annotated[int, Field(ge=1)] | None = None
    end_line: Annotated[int, Field(ge=1)] | None = None

    # ``_lines_are_ordered`` in the schema, but for the order itself (JSON Schema cannot compare fields).
    model_config = ConfigDict(
        json_schema_extra=forbidden_shapes(
            {
                "properties": {"end_line": {"type": "integer"}, "start_line": {"type": "null"}},
                "required": ["end_line"],
            },
        )
    )

    @model_validator(mode="after")
    def _lines_are_ordered(self) -> EvidenceRef:
        if self.end_line is not None and (self.start_line is None or self.end_line < self.start_line):
            raise ValueError("end_line needs a start_line at or before it")
        return self


class PrepareRequest(WireModel):
    """Ask for the prepared context of thread ``(run_id, instance_id)``.

    Budget: name a built-in ``model_profile``, or pass a ``profile``, or a bare ``budget_tokens``
    (which also caps a profile's budget). Read-your-writes: ``after_event_key`` is the last event
    this runtime published; the reply reflects it, or is a ``not_yet_recorded`` error after
    ``wait_ms`` — never a silently stale context — or ``event_rejected`` as soon as the fleet knows the
    event will never be recorded (refused, or its key recorded with another ``after_event_hash``).
    """

    # The rule of ``_names_a_budget``, in the schema: a budget source, and not both kinds of profile.
    model_config = ConfigDict(
        json_schema_extra=forbidden_shapes(
            {
                "properties": {
                    "model_profile": {"type": "null"},
                    "profile": {"type": "null"},
                    "budget_tokens": {"type": "null"},
                }
            },
            {
                "properties": {"model_profile": {"type": "string"}, "profile": {"type": "object"}},
                "required": ["model_profile", "profile"],
            },
        )
    )

    schema_version: SchemaVersion = 1
    session_id: Identifier
    # Checked against the session's principal when the session has one.
    principal_id: Identifier | None = None
    run_id: Identifier
    instance_id: Identifier
    purpose: Purpose = Purpose.ACTION
    model_profile: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    profile: ModelProfile | None = None
    budget_tokens: Annotated[int, Field(gt=0)] | None = None
    tools: tuple[ToolSchema, ...] = ()
    format: RequestFormat = "openai.chat"
    after_event_key: EventKeyStr | None = None
    # The named event's content hash as the ledger records it (``content_sha256``): a recorded body of
    # another hash under the key, or a refusal of the key, answers ``event_rejected`` at once.
    after_event_hash: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = None
    wait_ms: Annotated[int, Field(ge=0, le=60_000)] = 5_000
    usage: ReportedUsage | None = None
    # The provider refused the previous context of this thread as too long: answer a smaller one.
    after_overflow: ProviderOverflow | None = None
    # Records of this session to quote as evidence (search hits promoted by the runtime).
    evidence: tuple[EvidenceRef, ...] = Field(default=(), max_length=20)
    # Add the context tools (``context_read``, ``context_search``) after ``tools`` and tell the model
    # how to read back what its previews leave out; the runtime's client answers their calls.
    context_tools: bool = False
    # What the runtime plans for its next steps; part of the reply's forecast (``window_report.forecast``).
    forecast: ForecastDeclaration | None = None
    # The run's task budget: repeated on each prepare of the run; the reply reports
    # what is left, and a spent hard budget is refused with ``task_budget_exhausted``.
    task_budget: TaskBudget | None = None
    # A gateway check (``ctx.gateway.check``) answered ``context_reprepare_required``: include the
    # additions it validated (by its ``check_id``), so the runtime does not send them again.
    carry_additions_from: Annotated[str, Field(min_length=1, max_length=200)] | None = None

    @model_validator(mode="after")
    def _names_a_budget(self) -> PrepareRequest:
        if self.model_profile is None and self.profile is None and self.budget_tokens is None:
            raise ValueError("name a model_profile, give a profile, or set budget_tokens")
        if self.model_profile is not None and self.profile is not None:
            raise ValueError("give model_profile or profile, not both")
        return self


class ChatFunction(WireModel):
    """OpenAI ``function`` of a tool call: arguments as a JSON string."""

    name: str
    arguments: str


class ChatToolCall(WireModel):
    """OpenAI tool call."""

    id: str
    type: Literal["function"] = "function"
    function: ChatFunction


class ChatMessage(WireModel):
    """One message in OpenAI Chat Completions shape: ``None`` fields are omitted on the wire, so each
    message is exactly what the API takes (``"tool_calls": null`` fails the official SDK's types)."""

    model_config = ConfigDict(json_schema_extra=none_omitted)

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = Field(default=None, exclude_if=is_none)
    tool_calls: tuple[ChatToolCall, ...] | None = Field(default=None, exclude_if=is_none)
    tool_call_id: str | None = Field(default=None, exclude_if=is_none)


class ChatTool(WireModel):
    """A tool as Chat Completions takes it: ``{"type": "function", "function": {name, description, ...}}``."""

    type: Literal["function"] = "function"
    function: ToolSchema


# The provider request shape a prepare answers in: the canonical ``messages``/``tools`` are
# always OpenAI Chat's; for the other formats ``PreparedContext.request`` holds the provider's own body.
RequestFormat = Literal["openai.chat", "openai.responses", "anthropic.messages"]


class BlockKind(StrEnum):
    """What a block is."""

    INSTRUCTION = "instruction"
    TASK = "task"
    STATE = "state"
    SUMMARY = "summary"
    INTERACTION = "interaction"
    MATERIAL = "material"


class Retention(StrEnum):
    """How hard the assembler holds on to a block."""

    REQUIRED = "required"
    ACTIVE = "active"
    COMPRESSIBLE = "compressible"
    ON_DEMAND = "on_demand"


class RecordRef(WireModel):
    """A ledger record a block was built from."""

    seq: int
    event_key: str
    kind: str


class ContextBlock(WireModel):
    """A selectable unit of the view and the messages it produced, with its explanation."""

    block_id: str
    kind: BlockKind
    retention: Retention
    priority: Annotated[int, Field(ge=0, le=3)]
    droppable: bool
    reason: str
    sources: tuple[RecordRef, ...]
    first_message: int
    message_count: int
    tokens: int


class Authority(StrEnum):
    """Whose word a block carries to the model: derived from its kind and source records."""

    # The agent release's own instructions (system records).
    RELEASE_INSTRUCTION = "release_instruction"
    # Instructions the fleet itself writes (how to read back what a preview left out).
    FLEET_INSTRUCTION = "fleet_instruction"
    # The user's words: the run's task, the current request.
    USER = "user"
    # What the model said and called.
    MODEL = "model"
    # What a tool returned.
    TOOL_OUTPUT = "tool_output"
    # Quoted material: resources, child results, exported background, evidence.
    MATERIAL = "material"
    # What the fleet derived from records: the summary, state, notes in place of dropped history.
    FLEET_DERIVED = "fleet_derived"


class ProtectedBlock(WireModel):
    """A required block as the model must receive it: the gateway's final check holds requests to it.

    ``sha256`` is over the block's units in the context's ``format`` (docs/wire.md, "Protected
    blocks"): a runtime in any language can recompute it from the request it is about to send.
    """

    block_id: str
    kind: BlockKind
    authority: Authority
    sources: tuple[RecordRef, ...]
    sha256: str
    units: int


class OmittedBlock(WireModel):
    """A block left out of this context, and why."""

    block_id: str
    kind: BlockKind
    reason: str
    sources: tuple[RecordRef, ...]
    tokens: int


class PendingCall(WireModel):
    """A tool call whose outcome has not been recorded yet; its group is held back whole."""

    call_id: str
    name: str
    seq: int


class BudgetCategory(WireModel):
    """Tokens by what they are for; ``total`` is their sum.

    Each block counts whole (its messages' framing included) in the category of its kind, so a
    category is the sum of its blocks' ``tokens``; ``envelopes`` is what no block carries, the
    priming of the reply.
    """

    instructions: int = 0
    tool_schemas: int = 0
    history: int = 0
    materials: int = 0
    summaries: int = 0
    envelopes: int = 0
    total: int = 0


class ReductionCounts(WireModel):
    """What each step of the reduction order did to this context, in step order."""

    # 1. Later tool outputs byte-identical to one still in view, shown as a one-line reference.
    deduplicated: int = 0
    # 2. Outputs of the newest tool group cut to head + tail to fit the room left.
    trimmed: int = 0
    # 3. Optional material left out, and older tool groups whose outputs were masked to previews.
    dropped_material: int = 0
    masked: int = 0
    # The committed summary shown as its skeleton (0 or 1).
    summary_skeleton: int = 0
    # 4. Uncovered history left out because compaction did not land in time (``allow_drop_history``).
    dropped_history: int = 0
    # Tokens the steps above saved, all together.
    tokens_saved: int = 0


class BudgetReport(WireModel):
    """How the prepared context fits the model."""

    profile: str
    context_window: int | None = None
    input_limit: int | None = None
    output_reserve: int
    safety_margin: int
    input_budget: int
    used: BudgetCategory
    remaining: int
    counting_method: str
    estimated: bool
    estimated_input: int
    calibration: Literal["local", "provider_usage+local"] = "local"
    # Profiles without an offline tokenizer: local counts are multiplied by this learned factor
    # (never below 1) before they are held against the profile's budget; the usage reports it rests on.
    calibration_factor: float = 1.0
    calibration_reports: int = 0

    @model_serializer(mode="wrap")
    def _uncalibrated_as_before(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, object]:
        # An uncalibrated report is byte-identical to one from before calibration existed (stored
        # replies, golden files); the defaults come back when it is parsed.
        data: dict[str, object] = handler(self)
        if self.calibration_factor == 1.0 and self.calibration_reports == 0:
            data.pop("calibration_factor", None)
            data.pop("calibration_reports", None)
        return data

    reductions: ReductionCounts = ReductionCounts()


class WindowReport(WireModel):
    """Where a prepared context stands in its window."""

    level: WaterLevel
    # The context's tokens (``budget_report.used.total``) against the prepare's input budget.
    used: int
    input_budget: int
    # Tokens left before the red line.
    safe_remaining: int
    forecast: Forecast
    # YELLOW or above: optional material was dropped and older tool outputs masked to get back
    # under the yellow line (counted in ``budget_report.reductions``).
    trimmed: bool = False


class SourceWatermark(WireModel):
    """How far into the ledger this context looked."""

    thread_seq: int
    head_revision: int
    last_event_key: str | None = None


class SummaryHook(WireModel):
    """A context hook that shaped a committed summary, as recorded with it.

    ``context.compact.before``: it ended the covered range earlier or lowered the summary's target;
    ``context.compact.after``: it patched the summary's text fields (validated again before commit).
    """

    # The binding: ``name@version``, and the subject its service answered on.
    source: str
    point: Literal["context.compact.before", "context.compact.after"]
    subject: str
    # The hook set it belongs to: the release and the revision the session pinned.
    release: str
    hook_set_revision: Annotated[int, Field(ge=1)]
    # What it changed, for people: "range 3–20 → 3–12", "target 400 → 200", "patched progress".
    change: str = ""


class SummaryRef(WireModel):
    """The committed summary a context shows in place of the history it covers."""

    summary_id: str
    view_revision: int
    covered_from: int
    covered_to: int
    sources: tuple[int, ...]
    # The hooks that narrowed or patched this summary, in the order they ran (empty: none did).
    hooks: tuple[SummaryHook, ...] = ()


class HookTouch(WireModel):
    """A context hook that ran for a context: its source, what came of it, and its diagnostic note."""

    source: str
    # Where it ran; absent in contexts prepared before the point was recorded.
    point: Literal["context.prepare.before", "context.prepare.after"] | None = None
    # ok, patched, refused, timeout, error (the outcomes of ``ctx_hook_calls_total``; a reject fails
    # the prepare instead), or annotated (a prepare.after hook's note).
    outcome: str
    note: str = ""


class PreparedContext(WireModel):
    """The reply to a prepare: messages for the model, and the explanation of each."""

    schema_version: SchemaVersion = 1
    type: Literal["prepared_context"] = "prepared_context"
    prepared_id: str
    session_id: str
    run_id: str
    instance_id: str
    purpose: Purpose
    assembly_revision: str
    source_watermark: SourceWatermark
    messages: tuple[ChatMessage, ...]
    tools: tuple[ChatTool, ...]
    blocks: tuple[ContextBlock, ...]
    omitted: tuple[OmittedBlock, ...]
    pending_calls: tuple[PendingCall, ...]
    budget_report: BudgetReport
    view_revision: int = 0
    summary: SummaryRef | None = None
    reductions: tuple[str, ...] = ()
    compaction_wait_ms: int = 0
    policy: str = ""
    format: RequestFormat = "openai.chat"
    # The window this context belongs to: 1 until the thread first rolls over;
    # from window 2 on, the handoff it was rebuilt from.
    window: Annotated[int, Field(ge=1)] = 1
    handoff_id: str | None = None
    # Set on the one prepare that rolled the window over.
    rollover: RolloverReport | None = None
    # Every context hook that ran for this context: a context names the hooks that touched it.
    hooks: tuple[HookTouch, ...] = ()
    # The provider's own request body (messages, system, tools …) for a format other than openai.chat.
    request: dict[str, JsonValue] | None = None
    # Water level, safe remaining tokens and forecast; absent in replies from before.
    # Left out when None even by a plain dump, so a context assembled without a window policy is
    # byte-identical to one from before windows (stored replies, golden files).
    window_report: WindowReport | None = Field(default=None, exclude_if=is_none)
    # The run's task budget and ledger, when the request declared one.
    task_budget: TaskBudgetReport | None = Field(default=None, exclude_if=is_none)
    # Every required block, in order, with the hash the gateway's final check verifies.
    protected_block_manifest: tuple[ProtectedBlock, ...] = ()

    def openai_messages(self) -> list[dict[str, JsonValue]]:
        """The messages exactly as an OpenAI-compatible endpoint takes them."""
        return [m.model_dump(mode="json", exclude_none=True) for m in self.messages]
