"""Compaction: policy and triggers, range selection, summarizers, validation and commit."""

__all__: list[str] = []
