"""The provider request a prepare answers in. Pure."""

from __future__ import annotations

from typing import assert_never

from pydantic import JsonValue

from contracts import RequestFormat

from .anthropic_messages import anthropic_request
from .bundle import ContextBundle
from .openai_responses import responses_request

__all__ = ["provider_request"]


def provider_request(format: RequestFormat, bundle: ContextBundle) -> dict[str, JsonValue] | None:
    """The provider's own request body for ``format``; ``None`` for OpenAI Chat, whose shape the
    canonical ``messages``/``tools`` already are."""
    match format:
        case "openai.chat":
            return None
        case "openai.responses":
            return responses_request(bundle)
        case "anthropic.messages":
            return anthropic_request(bundle)
        case _:
            assert_never(format)
