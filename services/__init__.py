"""The domain: ledger planning, tokens, budget and assembly, plus the store, client and replay."""

__all__: list[str] = []
