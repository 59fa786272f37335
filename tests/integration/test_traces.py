"""OpenTelemetry spans of a real fleet, read back from the SDK's in-memory exporter."""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracer, SpanKind, StatusCode

from contracts import ContextPolicy, PrepareRequest
from contracts._base import reply_json
from contracts.hook_protocol import HookReply
from contracts.hooks import HookBinding, HookPoint, HookSet
from contracts.windows import WindowPolicy, WindowStrategy
from services.app.tracing import Tracing, start_tracing
from ctxfleet_client.client import FleetClient
from contracts.exceptions import ContextBudgetExceeded
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import HookService, eventually, make_settings
from tests.integration.test_compaction import _groups, _policy, _request, _start, _summaries
from tests.integration.test_windows import CATALOG, _phase_change
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]


@pytest.fixture
def exported() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
async def traced_fleet(
    streams: str, database_url: str, tmp_path: Path, exported: InMemorySpanExporter
) -> AsyncIterator[Callable[..., Awaitable[Fleet]]]:
    """Start a fleet whose spans go to ``exported`` (``tracing=None``: as ``CTX_TRACES`` says)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    started: list[Fleet] = []

    async def start(traced: bool = True, **overrides: Any) -> Fleet:
        fleet = Fleet(
            make_settings(streams, database_url, tmp_path, **overrides),
            nats_urls=(streams,),
            database_url=database_url,
            tracing=Tracing.with_provider(provider) if traced else None,
        )
        await fleet.start()
        started.append(fleet)
        return fleet

    yield start
    for fleet in started:
        await fleet.stop()
    provider.shutdown()


def _named(exported: InMemorySpanExporter, name: str, thread_id: str) -> list[ReadableSpan]:
    return [
        s
        for s in exported.get_finished_spans()
        if s.name == name and (s.attributes or {}).get("gen_ai.conversation.id") == thread_id
    ]


async def test_a_prepare_continues_the_runtimes_trace_and_carries_its_budget_and_hook_spans(
    traced_fleet, client: FleetClient, hook_service: HookService, exported: InMemorySpanExporter
) -> None:
    await traced_fleet()
    subject = f"hooks.default.audit-{uuid.uuid4().hex[:8]}"
    headers: list[dict[str, str]] = []

    async def answer(msg: Any) -> None:
        headers.append(dict(msg.headers or {}))
        await msg.respond(reply_json(HookReply(decision="continue")))

    await hook_service.nc.subscribe(subject, cb=answer)
    await hook_service.nc.flush()
    release = "rel-traced"
    await client.register_hooks(
        HookSet(
            release=release,
            hooks=(HookBinding(name="audit", version="1", point=HookPoint.PREPARE_BEFORE, subject=subject),),
        )
    )
    t = Thread()
    await client.append(t.system("You fix bugs.").model_copy(update={"agent_release": release}))
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    runtime = TracerProvider().get_tracer("runtime")

    with runtime.start_as_current_span("agent step") as step:
        prepared = await client.prepare(
            PrepareRequest(
                session_id=t.session_id,
                run_id=t.run_id,
                instance_id=t.instance_id,
                model_profile="gpt-4o",
                after_event_key="task",
            )
        )

    [span] = _named(exported, "ctx.prepare", t.thread_id)
    report = prepared.budget_report
    assert span.kind is SpanKind.SERVER
    assert span.context is not None and span.parent is not None
    assert span.context.trace_id == step.get_span_context().trace_id
    assert span.parent.span_id == step.get_span_context().span_id
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "search_memory",
        "gen_ai.conversation.id": t.thread_id,
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.usage.input_tokens": report.estimated_input,
        "ctx.thread.id": t.thread_id,
        "ctx.tenant": "default",
        "ctx.session.id": t.session_id,
        "ctx.purpose": "action",
        "ctx.prepared.id": prepared.prepared_id,
        "ctx.policy": prepared.policy,
        "ctx.view.revision": prepared.view_revision,
        "ctx.budget.profile": "gpt-4o",
        "ctx.budget.input_tokens": report.input_budget,
        "ctx.tokens.used": report.used.total,
        "ctx.blocks.kept": len(prepared.blocks),
        "ctx.blocks.omitted": len(prepared.omitted),
        "ctx.reductions": tuple(prepared.reductions),
        "ctx.compaction.wait_ms": 0,
        "ctx.window": 1,
        **({"ctx.window.level": prepared.window_report.level.value} if prepared.window_report else {}),
    }
    [hook] = _named(exported, "ctx.hook", t.thread_id)
    assert hook.parent is not None and hook.parent.span_id == span.context.span_id
    assert dict(hook.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "audit@1",
        "gen_ai.tool.type": "extension",
        "gen_ai.conversation.id": t.thread_id,
        "ctx.thread.id": t.thread_id,
        "ctx.hook.source": "audit@1",
        "ctx.hook.point": "context.prepare.before",
        "ctx.hook.subject": subject,
        "ctx.hook.outcome": "ok",
    }
    assert [(h.source, h.outcome) for h in prepared.hooks] == [("audit@1", "ok")]
    # The hook's service is handed the trace too, as the hook span's child.
    assert hook.context is not None
    assert [h["traceparent"] for h in headers] == [
        f"00-{hook.context.trace_id:032x}-{hook.context.span_id:016x}-{hook.context.trace_flags:02x}"
    ]


async def test_a_refused_prepare_is_an_error_span_with_the_errors_code(
    traced_fleet, client: FleetClient, exported: InMemorySpanExporter
) -> None:
    await traced_fleet()
    t = Thread()
    await client.append(t.system("rule " * 3_000))
    await client.append(t.user("hi", key="task"))
    with pytest.raises(ContextBudgetExceeded):
        await client.prepare(_request(t, 1_000, "task"))  # the instructions alone are over the budget

    [span] = _named(exported, "ctx.prepare", t.thread_id)
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "context_budget_exceeded"


async def test_a_compaction_job_span_carries_the_covered_range_and_tokens_before_and_after(
    traced_fleet, client: FleetClient, exported: InMemorySpanExporter
) -> None:
    await traced_fleet()
    t = Thread()
    await _start(client, t, await _policy(client, "traced-bg", 3_000, keep_recent_groups=1))
    await client.append(t.user("Fix the failing import in app.py", key="task"))
    last = await _groups(client, t, 14)

    async def summarized() -> bool:
        return await _summaries(client, t) >= 1

    await eventually(summarized, what="a background compaction")
    prepared = await client.prepare(_request(t, 3_000, last))

    assert prepared.summary is not None
    committed = [
        s
        for s in _named(exported, "ctx.compaction", t.thread_id)
        if (s.attributes or {}).get("ctx.compaction.status") == "committed"
    ]
    [span] = [s for s in committed if (s.attributes or {})["ctx.view.revision_after"] == 1]
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "update_memory"
    assert attributes["ctx.session.id"] == t.session_id
    assert attributes["ctx.budget.input_tokens"] == 3_000
    assert attributes["ctx.view.revision"] == 0
    assert attributes["ctx.compaction.tokens_before"] > attributes["ctx.compaction.tokens_after"] > 0
    # The first summary: the range the prepare's summary shows, if no later one replaced it.
    if prepared.summary.view_revision == 1:
        assert (attributes["ctx.compaction.covered_from"], attributes["ctx.compaction.covered_to"]) == (
            prepared.summary.covered_from,
            prepared.summary.covered_to,
        )
    assert attributes["ctx.compaction.covered_to"] >= attributes["ctx.compaction.covered_from"] >= 1
    assert span.kind is SpanKind.CONSUMER


async def test_a_window_rollover_is_a_span_inside_the_prepare_that_performed_it(
    traced_fleet, client: FleetClient, exported: InMemorySpanExporter
) -> None:
    await traced_fleet()
    await client.register_catalog(CATALOG)
    await client.register_policy(
        ContextPolicy(
            name="traced-phases",
            model_profile=None,
            budget_tokens=20_000,
            window=WindowPolicy(strategy=WindowStrategy.ROLLOVER),
        )
    )
    t = Thread()
    await client.append(
        t.system("You run the yard.").model_copy(
            update={"agent_release": "yard@1", "policy": "traced-phases"}
        )
    )
    await client.append(t.user("Survey the yard, then move item 7.", key="task"))
    await client.append(_phase_change(t, "survey", "p1"))
    await client.append(t.assistant("surveying row 1", calls=(("s1", "count_stock", {}),)))
    await client.append(t.outcome("s1", "row 1 clear", key="o-s1"))
    request = PrepareRequest(
        session_id=t.session_id,
        run_id=t.run_id,
        instance_id="main",
        budget_tokens=20_000,
        after_event_key="o-s1",
    )
    await client.prepare(request)
    await client.append(_phase_change(t, "moving", "p2"))
    rolled = await client.prepare(request.model_copy(update={"after_event_key": "p2"}))

    assert rolled.rollover is not None
    [span] = _named(exported, "ctx.rollover", t.thread_id)
    prepares = _named(exported, "ctx.prepare", t.thread_id)
    [parent] = [p for p in prepares if (p.attributes or {}).get("ctx.prepared.id") == rolled.prepared_id]
    assert span.parent is not None and parent.context is not None
    assert span.parent.span_id == parent.context.span_id
    assert span.start_time is not None and span.end_time is not None
    assert span.end_time - span.start_time == rolled.rollover.rollover_ms * 1_000_000
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "update_memory",
        "gen_ai.conversation.id": t.thread_id,
        "ctx.thread.id": t.thread_id,
        "ctx.rollover.trigger": "phase_boundary",
        "ctx.rollover.previous_window": 1,
        "ctx.window": 2,
        "ctx.rollover.handoff_tokens": rolled.rollover.handoff_tokens,
        "ctx.view.revision": rolled.view_revision,
        "ctx.rollover.handoff_id": rolled.handoff_id,
    }
    assert (parent.attributes or {})["ctx.window"] == 2


async def test_tracing_off_by_default_uses_the_no_op_tracer_and_exports_nothing(
    traced_fleet, client: FleetClient, exported: InMemorySpanExporter
) -> None:
    fleet = await traced_fleet(traced=False)
    t = Thread()
    await client.append(t.system("You fix bugs."))
    await client.append(t.user("Fix it", key="task"))

    await client.prepare(
        PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id=t.instance_id,
            budget_tokens=4_000,
            after_event_key="task",
        )
    )

    assert fleet.tracing is not None and not fleet.tracing.enabled
    assert isinstance(fleet.tracing.tracer, NoOpTracer)
    assert exported.get_finished_spans() == ()


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver on loopback: keeps each request's path and decoded body."""

    received: list[tuple[str, ExportTraceServiceRequest]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, ExportTraceServiceRequest.FromString(body)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return None


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[str, ExportTraceServiceRequest]]]]:
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    received: list[tuple[str, ExportTraceServiceRequest]] = []
    _Collector.received = received
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", received
    server.shutdown()
    server.server_close()


def test_otlp_tracing_exports_to_the_endpoint_and_service_the_otel_variables_name(
    collector: tuple[str, list[tuple[str, ExportTraceServiceRequest]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "fleet-under-test")
    tracing = start_tracing("otlp")

    with tracing.prepare({}, "r-1.main", "default"):
        pass
    tracing.shutdown()  # flushes the batch

    [(path, request)] = received
    assert path == "/v1/traces"
    [resource_spans] = request.resource_spans
    resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert resource["service.name"] == "fleet-under-test"
    [scope_spans] = resource_spans.scope_spans
    assert scope_spans.scope.name == "ctxfleet"
    assert scope_spans.schema_url == "https://opentelemetry.io/schemas/1.44.0"
    [span] = scope_spans.spans
    attributes = {a.key: a.value.string_value for a in span.attributes}
    assert (span.name, attributes["gen_ai.conversation.id"]) == ("ctx.prepare", "r-1.main")


def test_tracing_off_builds_no_provider_and_its_spans_record_nothing() -> None:
    tracing = start_tracing("off")

    with tracing.prepare({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, "r-1.main", "t") as span:
        assert not span.is_recording()
    assert tracing.provider is None and isinstance(tracing.tracer, NoOpTracer)
