"""The model gateway's final check: the request about to be sent, held to its prepared context.

``ctx.gateway.check.<tenant>.<run>.<instance>`` (request/reply) takes a :class:`FinalCheckRequest` — the
provider request body the runtime is about to send, the ``prepared_id`` it was built from and every
addition the runtime or its model hooks made — and answers a :class:`FinalCheck` (``ok``, or
``context_reprepare_required`` once when the additions first cross the soft threshold) or an
``ErrorReply``: ``context_protected_block_altered``, ``context_addition_refused``,
``context_budget_exceeded`` (never sendable) or ``prepared_context_not_found``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, JsonValue

from ._base import SchemaVersion, WireModel
from .hooks import AdditionCategory
from .ids import Identifier, split_thread_id
from .prepare import RequestFormat
from .subjects import check_tenant

__all__ = [
    "GATEWAY_CHECK",
    "ADDITION_SOURCE_PATTERN",
    "AlteredHow",
    "FinalCheck",
    "FinalCheckRequest",
    "GatewayAddition",
    "gateway_check_subject",
]

GATEWAY_CHECK = "ctx.gateway.check"
# ``HookBinding.source``: ``<name>@<version>``.
ADDITION_SOURCE_PATTERN = r"^[A-Za-z0-9_-]{1,128}@\S{1,100}$"

# How a protected block failed the check (``details.how`` of ``context_protected_block_altered``).
AlteredHow = Literal["missing", "changed", "reordered", "downgraded"]


def gateway_check_subject(tenant: str, thread_id: str) -> str:
    """Where a runtime of ``tenant`` asks for the final check of a request of ``thread_id``."""
    split_thread_id(thread_id)
    return f"{GATEWAY_CHECK}.{check_tenant(tenant)}.{thread_id}"


class GatewayAddition(WireModel):
    """Text the runtime or one of its hooks added to the prepared request, with who added it and as what.

    ``text`` is the added unit's text exactly as it is in the request (a message's ``content``, a
    content block's ``text``); an edited optional block is an addition of its new text.
    """

    source: Annotated[str, Field(pattern=ADDITION_SOURCE_PATTERN)]
    category: AdditionCategory
    text: Annotated[str, Field(min_length=1, max_length=1_000_000)]


class FinalCheckRequest(WireModel):
    """Check the provider request built from prepared context ``prepared_id`` before sending it."""

    schema_version: SchemaVersion = 1
    run_id: Identifier
    instance_id: Identifier
    prepared_id: Annotated[str, Field(min_length=1, max_length=200)]
    # Idempotency: the same attempt asked again answers the same verdict; a new request body is a new attempt.
    attempt: Annotated[int, Field(ge=1, le=1_000)] = 1
    format: RequestFormat = "openai.chat"
    # The provider body as it will be sent (``messages``/``tools``; ``instructions``/``input``/``tools``;
    # ``system``/``messages``/``tools``); other keys (``model``, ``max_tokens`` …) are ignored.
    request: dict[str, JsonValue]
    additions: tuple[GatewayAddition, ...] = Field(default=(), max_length=64)


class FinalCheck(WireModel):
    """A sendable verdict, or a request to prepare again once (``context_reprepare_required``)."""

    schema_version: SchemaVersion = 1
    type: Literal["final_check"] = "final_check"
    check_id: str
    prepared_id: str
    attempt: int
    outcome: Literal["ok", "context_reprepare_required"]
    final_tokens: int
    input_budget: int
    remaining: int
    # The policy's compaction trigger (``context_ratio`` of the input budget); absent when it is off.
    soft_limit: int | None = None
    # sha256 of the canonical JSON of ``request`` (docs/wire.md): what the model is sent.
    request_sha256: str
    # The sources of the additions, in request order (one entry per added unit).
    addition_sources: tuple[str, ...] = ()
