"""What talks to the outside: the fleet's client, trace replay, the HTTP summarizer."""

__all__: list[str] = []
