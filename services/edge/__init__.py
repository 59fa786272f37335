"""What drives a fleet through the client (trace replay, evaluation) and the HTTP summarizer."""

__all__: list[str] = []
