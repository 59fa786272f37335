"""OpenTelemetry spans for what the fleet does to a thread: prepare, compaction, rollover, hook call.

Off by default (``CTX_TRACES=off``): the tracer is the API's no-op one, every span is non-recording
and no attribute is computed. ``CTX_TRACES=otlp`` installs the SDK with its OTLP/HTTP exporter,
configured by the standard ``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` …) as the SDK reads them.

Attribute names follow the OpenTelemetry GenAI semantic conventions of semconv 1.44.0 (the
``gen_ai`` registry, status Development), with the memory operations (``search_memory``,
``update_memory``) of the open-telemetry/semantic-conventions-genai registry:

- prepare: ``search_memory`` — the fleet reads the thread's memory and returns the model's input;
  ``gen_ai.usage.input_tokens`` is that input as the fleet counts it (``estimated_input``).
- compaction and rollover: ``update_memory`` — the thread's view is rewritten; the usage attributes
  of a compaction are its summarizer's (when the provider reported them).
- hook call: ``execute_tool`` — a hook is a service the fleet calls (``gen_ai.tool.type=extension``).

``gen_ai.usage.cache_read.input_tokens`` is not set: the fleet never sees a provider's cache figures.
Everything the conventions have no name for is ``ctx.*``.

A span starts where the outcome becomes known, at the worker's boundary, and continues the
requester's trace when its request carried a W3C ``traceparent`` header.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import propagate, trace
from opentelemetry.util.types import AttributeValue
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from contracts import CompactionJob, PreparedContext
    from contracts.hook_protocol import HookCall
    from contracts.hooks import HookBinding

    from services.app.compacting import JobOutcome

__all__ = [
    "SCHEMA_URL",
    "Tracing",
    "TracesMode",
    "record_compaction",
    "record_error",
    "record_outcome",
    "record_prepared",
    "record_rollover",
    "start_tracing",
]

TracesMode = Literal["off", "otlp"]
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"

# The GenAI conventions' names (semconv 1.44.0 and the gen_ai registry's memory operations).
_OPERATION = "gen_ai.operation.name"
_CONVERSATION = "gen_ai.conversation.id"
_REQUEST_MODEL = "gen_ai.request.model"
_INPUT_TOKENS = "gen_ai.usage.input_tokens"
_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
_TOOL_NAME = "gen_ai.tool.name"
_TOOL_TYPE = "gen_ai.tool.type"
_ERROR_TYPE = "error.type"
# Tracing off: one shared, reusable context yielding the API's non-recording span.
_NO_SPAN: AbstractContextManager[Span] = nullcontext(trace.INVALID_SPAN)
# Prepare and hook spans: ``record_error`` / ``record_outcome`` set their status, not an exception.
_QUIET = {"record_exception": False, "set_status_on_exception": False}


@dataclass(frozen=True)
class Tracing:
    """The fleet's tracer; ``off()`` is the API's no-op one, which records and exports nothing."""

    tracer: Tracer
    provider: TracerProvider | None = None

    @classmethod
    def off(cls) -> Tracing:
        """No spans: what a fleet runs with unless ``CTX_TRACES`` turns tracing on."""
        return cls(trace.NoOpTracer())

    @property
    def enabled(self) -> bool:
        """Whether spans are recorded (and exported) at all."""
        return self.provider is not None

    @classmethod
    def with_provider(cls, provider: TracerProvider) -> Tracing:
        """Spans from ``provider`` (tests hand in one with the SDK's in-memory exporter)."""
        return cls(provider.get_tracer("ctxfleet", schema_url=SCHEMA_URL), provider)

    def shutdown(self) -> None:
        """Export what is still buffered, then stop exporting."""
        if self.provider is not None:
            self.provider.shutdown()

    def _span(
        self, name: str, kind: SpanKind, attributes: dict[str, AttributeValue], **options: Any
    ) -> AbstractContextManager[Span]:
        if not self.enabled:
            return _NO_SPAN
        return self.tracer.start_as_current_span(name, kind=kind, attributes=attributes, **options)

    def prepare(
        self, headers: Mapping[str, str], thread_id: str, tenant: str
    ) -> AbstractContextManager[Span]:
        """The span of one prepare request, continuing the requester's trace (``traceparent``)."""
        attributes: dict[str, AttributeValue] = {
            _OPERATION: "search_memory",
            _CONVERSATION: thread_id,
            "ctx.thread.id": thread_id,
            "ctx.tenant": tenant,
        }
        return self._span(
            "ctx.prepare", SpanKind.SERVER, attributes, context=propagate.extract(headers), **_QUIET
        )

    def compaction(self, job: CompactionJob) -> AbstractContextManager[Span]:
        """The span of one compaction job, from taking it to its final outcome."""
        attributes: dict[str, AttributeValue] = {
            _OPERATION: "update_memory",
            _CONVERSATION: job.thread_id,
            "ctx.thread.id": job.thread_id,
            "ctx.session.id": job.session_id,
            "ctx.compaction.job_id": job.job_id,
            "ctx.compaction.reasons": list(job.reasons),
            "ctx.compaction.urgent": job.urgent,
            "ctx.compaction.watermark": job.watermark,
            "ctx.view.revision": job.view_revision,
            "ctx.budget.input_tokens": job.input_budget,
            "ctx.policy": f"{job.policy_name}@{job.policy_revision}",
        }
        return self._span("ctx.compaction", SpanKind.CONSUMER, attributes)

    def hook(self, binding: HookBinding, call: HookCall) -> AbstractContextManager[Span]:
        """The span of one hook call, a child of the prepare or compaction it serves."""
        attributes: dict[str, AttributeValue] = {
            _OPERATION: "execute_tool",
            _TOOL_NAME: binding.source,
            _TOOL_TYPE: "extension",
            _CONVERSATION: call.thread_id,
            "ctx.thread.id": call.thread_id,
            "ctx.hook.source": binding.source,
            "ctx.hook.point": binding.point.value,
            "ctx.hook.subject": binding.subject,
        }
        return self._span("ctx.hook", SpanKind.CLIENT, attributes, **_QUIET)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add the current span's ``traceparent`` to an outgoing request's headers."""
        if self.enabled:
            propagate.inject(headers)


def record_prepared(span: Span, prepared: PreparedContext) -> None:
    """What a prepare answered: tokens against the budget, blocks kept and left out, its window."""
    report = prepared.budget_report
    span.set_attributes(
        {
            _INPUT_TOKENS: report.estimated_input,
            "ctx.session.id": prepared.session_id,
            "ctx.purpose": prepared.purpose.value,
            "ctx.prepared.id": prepared.prepared_id,
            "ctx.policy": prepared.policy,
            "ctx.view.revision": prepared.view_revision,
            "ctx.budget.profile": report.profile,
            "ctx.budget.input_tokens": report.input_budget,
            "ctx.tokens.used": report.used.total,
            "ctx.blocks.kept": len(prepared.blocks),
            "ctx.blocks.omitted": len(prepared.omitted),
            "ctx.reductions": list(prepared.reductions),
            "ctx.compaction.wait_ms": prepared.compaction_wait_ms,
            "ctx.window": prepared.window,
        }
    )
    # A model profile is named after its model; a bare budget ("budget:N") names none.
    if not report.profile.startswith("budget:"):
        span.set_attribute(_REQUEST_MODEL, report.profile)
    if prepared.window_report is not None:
        span.set_attribute("ctx.window.level", prepared.window_report.level.value)


def record_rollover(tracing: Tracing, thread_id: str, prepared: PreparedContext, ended_ns: int) -> None:
    """A span for the window rollover a prepare performed, placed inside the prepare's span.

    Started after the fact: the rollover's own duration is in its report, and a prepare that rolls
    over is known only once it answers.
    """
    rollover = prepared.rollover
    if rollover is None or not tracing.enabled:
        return
    span = tracing.tracer.start_span(
        "ctx.rollover",
        start_time=ended_ns - rollover.rollover_ms * 1_000_000,
        attributes={
            _OPERATION: "update_memory",
            _CONVERSATION: thread_id,
            "ctx.thread.id": thread_id,
            "ctx.rollover.trigger": rollover.trigger.value,
            "ctx.rollover.previous_window": rollover.previous_window,
            "ctx.window": prepared.window,
            "ctx.rollover.handoff_tokens": rollover.handoff_tokens,
            "ctx.view.revision": prepared.view_revision,
        },
    )
    if prepared.handoff_id is not None:
        span.set_attribute("ctx.rollover.handoff_id", prepared.handoff_id)
    span.end(end_time=ended_ns)


def record_compaction(span: Span, outcome: JobOutcome) -> None:
    """A compaction job's final outcome: status, tokens before and after, the range it covered."""
    if not span.is_recording():
        return
    span.set_attributes(
        {
            "ctx.compaction.status": outcome.status,
            "ctx.compaction.stage": outcome.stage,
            "ctx.compaction.tokens_before": outcome.tokens_before,
            "ctx.compaction.tokens_after": outcome.tokens_after,
            "ctx.compaction.calls": outcome.calls,
        }
    )
    if outcome.detail:
        span.set_attribute("ctx.compaction.detail", outcome.detail)
    if outcome.status == "committed":
        span.set_attributes(
            {
                "ctx.view.revision_after": outcome.view_revision,
                "ctx.compaction.covered_from": outcome.covered_from,
                "ctx.compaction.covered_to": outcome.covered_to,
                "ctx.compaction.target_reached": outcome.target_reached,
            }
        )
    if outcome.calls:
        span.set_attributes(
            {
                "ctx.compaction.summarizer": outcome.summarizer,
                _INPUT_TOKENS: outcome.input_tokens,
                _OUTPUT_TOKENS: outcome.output_tokens,
            }
        )
    if outcome.status == "failed":
        span.set_status(Status(StatusCode.ERROR, outcome.detail or outcome.stage))


def record_outcome(span: Span, outcome: str) -> None:
    """A hook call's outcome (``ok``, ``patched``, ``refused``, ``rejected``, ``timeout``, ``error``)."""
    span.set_attribute("ctx.hook.outcome", outcome)
    if outcome in ("timeout", "error"):
        span.set_status(Status(StatusCode.ERROR, outcome))


def record_error(span: Span, code: str, message: str) -> None:
    """A request or job that ended in the fleet's typed error ``code``."""
    span.set_attributes({_ERROR_TYPE: code, "ctx.error.code": code})
    span.set_status(Status(StatusCode.ERROR, message))


def start_tracing(mode: TracesMode) -> Tracing:
    """The fleet's tracing for ``CTX_TRACES``: the no-op tracer, or the SDK exporting over OTLP/HTTP."""
    if mode == "off":
        return Tracing.off()
    # Imported only when tracing is on: a fleet that does not trace never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create() reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (the service is
    # "ctxfleet" unless they name it); the exporter reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT,
    # _HEADERS, _TIMEOUT and the rest.
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "ctxfleet"}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Tracing.with_provider(provider)
