"""Adapters for agent frameworks: each records the framework's conversation and prepares its context.

Each framework's module is imported by name, with its extra installed (``ctxfleet-client[langchain]``,
which ``langgraph`` uses too, ``[openai-agents]``, ``[pydantic-ai]``); this package itself needs none.
"""

from .conversation import FleetConversation, Turn

__all__ = ["FleetConversation", "Turn"]
