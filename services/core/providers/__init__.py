"""Provider adapters: the canonical context in each provider's own request shape. Pure."""

__all__: list[str] = []
