"""What drives a fleet through the client (trace replay, evaluation, the provider proxy) and the HTTP
summarizer."""

__all__: list[str] = []
