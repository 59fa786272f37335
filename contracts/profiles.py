"""The model profiles the fleet knows by name, and the request formats: what ``PrepareRequest`` names.

``model_profile="gpt-4o"`` budgets a prepare from the profile's window, output reserve and safety
margin; ``format`` picks the provider shape of the prepared request. A runtime uses the constants
rather than spelling the strings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, get_args

from .prepare import ModelProfile, RequestFormat

__all__ = [
    "ANTHROPIC_MESSAGES",
    "BUILTIN_PROFILES",
    "FORMATS",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "PROFILE_NAMES",
]

# The formats a prepare answers in: ``PreparedContext.request`` holds the provider body in this shape.
OPENAI_CHAT: Final[RequestFormat] = "openai.chat"
OPENAI_RESPONSES: Final[RequestFormat] = "openai.responses"
ANTHROPIC_MESSAGES: Final[RequestFormat] = "anthropic.messages"
FORMATS: Final[tuple[RequestFormat, ...]] = get_args(RequestFormat)

# Public limits of common models. The safety margin absorbs what no local count can see
# (provider-side framing, tokenizer drift); it is part of the profile so it is versioned with it.
BUILTIN_PROFILES: Final[Mapping[str, ModelProfile]] = {
    p.name: p
    for p in (
        ModelProfile(name="gpt-4o", context_window=128_000, output_reserve=16_384, safety_margin=2_048),
        ModelProfile(name="gpt-4o-mini", context_window=128_000, output_reserve=16_384, safety_margin=2_048),
        ModelProfile(name="gpt-4.1", context_window=1_047_576, output_reserve=32_768, safety_margin=8_192),
        ModelProfile(name="o3", context_window=200_000, output_reserve=100_000, safety_margin=2_048),
        ModelProfile(
            name="gpt-4-turbo",
            context_window=128_000,
            output_reserve=4_096,
            safety_margin=2_048,
            encoding="cl100k_base",
        ),
        ModelProfile(
            name="gpt-3.5-turbo",
            context_window=16_385,
            output_reserve=4_096,
            safety_margin=512,
            encoding="cl100k_base",
        ),
        # Anthropic ships no offline tokenizer (and it changes between model versions): counted as the
        # local o200k count times the profile's learned calibration, with a wider margin for the
        # framing and drift no usage report has shown yet.
        ModelProfile(
            name="claude-sonnet-4",
            context_window=200_000,
            output_reserve=16_384,
            safety_margin=6_000,
            encoding="estimate",
        ),
        ModelProfile(
            name="claude-opus-4",
            context_window=200_000,
            output_reserve=16_384,
            safety_margin=6_000,
            encoding="estimate",
        ),
    )
}

# The names ``PrepareRequest.model_profile`` accepts, in the order above.
PROFILE_NAMES: Final[tuple[str, ...]] = tuple(BUILTIN_PROFILES)
