"""The pure core: planning, state, blocks, assembly, budgets, tokens,
compaction and evaluation logic. No I/O."""

__all__: list[str] = []
