"""Windows: the rollover decision, the handoff and the next window's context."""

__all__: list[str] = []
