"""Calls a context hook over NATS: a request to the binding's subject, bounded by its timeout."""

from __future__ import annotations

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from contracts._base import reply_json
from contracts.hook_protocol import HookCall, HookReply
from contracts.hooks import HookBinding, HookPoint
from contracts.wire_json import WireJsonError, validate_wire

from services.app.hook_registry import HookOutcome
from services.app.tracing import Tracing
from contracts.exceptions import HookFailed, HookTimeout

__all__ = ["HookMetrics", "NatsHookRunner"]


class NatsHookRunner:
    """The ``HookRunner`` of the fleet: one NATS request per hook call."""

    def __init__(self, nc: NatsClient, tracing: Tracing | None = None) -> None:
        self._nc = nc
        self._tracing = tracing or Tracing.off()

    async def call(self, binding: HookBinding, call: HookCall) -> HookReply:
        point = binding.point.value
        # The hook's service may continue the trace of the prepare or compaction that called it.
        headers: dict[str, str] = {}
        self._tracing.inject(headers)
        try:
            msg = await self._nc.request(
                binding.subject, reply_json(call), timeout=binding.timeout_ms / 1000, headers=headers or None
            )
        except NatsTimeout:
            raise HookTimeout(binding.source, point, binding.timeout_ms) from None
        except NoRespondersError:
            raise HookFailed(binding.source, point, f"no responder on {binding.subject}") from None
        except NatsError as exc:
            raise HookFailed(binding.source, point, f"request failed: {type(exc).__name__}") from None
        try:
            return validate_wire(HookReply, msg.data)
        except WireJsonError as exc:
            raise HookFailed(binding.source, point, f"malformed reply: {exc.message}") from None
        except ValidationError as exc:
            raise HookFailed(binding.source, point, f"malformed reply ({exc.error_count()} errors)") from None


class HookMetrics:
    """``ctx_hook_calls_total{point,outcome}`` and ``ctx_hook_seconds{point}`` (a ``HookObserver``)."""

    def __init__(self, calls: Counter, seconds: Histogram) -> None:
        self._calls = calls
        self._seconds = seconds

    def observe(self, point: HookPoint, outcome: HookOutcome, seconds: float) -> None:
        self._calls.labels(point=point.value, outcome=outcome).inc()
        self._seconds.labels(point=point.value).observe(seconds)
