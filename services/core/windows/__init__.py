"""Windows: the rollover decision, the handoff and the next window's context (seed 004 §22–36)."""

__all__: list[str] = []
