"""The Python client of a ctxfleet fleet: publish events, prepare contexts, answer the context tools.

::

    from ctxfleet_client import FleetClient, PrepareRequest, UserInputEvent

    async with await FleetClient.from_env() as fleet:  # the lines `ctxfleet env` prints
        step = await fleet.append_and_prepare(event, request)

The wire models (``ctxfleet_client.models``) and the error tree (``ctxfleet_client.errors``) are the
fleet's own; both are re-exported here.
"""

from contracts.profiles import (
    ANTHROPIC_MESSAGES,
    BUILTIN_PROFILES,
    FORMATS,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    PROFILE_NAMES,
)

from .client import DEADLINE_HEADER, STATUS_HEADER, AppendAck, FleetClient, StepReply, connect_nats
from .connection import FleetAddress, nats_connection, parse_nats_urls, redact_url
from .context_tools import Answered, ContextToolAnswer, ContextTools, ModelToolCall, tool_calls_of
from .errors import *  # noqa: F403
from .errors import __all__ as _ERRORS
from .models import *  # noqa: F403
from .models import __all__ as _MODELS

__all__ = [
    "ANTHROPIC_MESSAGES",
    "BUILTIN_PROFILES",
    "DEADLINE_HEADER",
    "FORMATS",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "PROFILE_NAMES",
    "STATUS_HEADER",
    "Answered",
    "AppendAck",
    "ContextToolAnswer",
    "ContextTools",
    "FleetAddress",
    "FleetClient",
    "ModelToolCall",
    "StepReply",
    "connect_nats",
    "nats_connection",
    "parse_nats_urls",
    "redact_url",
    "tool_calls_of",
    *_ERRORS,
    *_MODELS,
]
