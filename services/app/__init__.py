"""The workers' services: each composes the core with the store and the bus ports."""

__all__: list[str] = []
