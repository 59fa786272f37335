"""Provider adapters: the canonical context in each provider's own request shape (design D4.5). Pure."""

__all__: list[str] = []
