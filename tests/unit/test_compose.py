"""Composition: a process builds exactly the workers its settings name, around one shared view cache,
and loads the tokenizers they need before it serves."""

from __future__ import annotations

from typing import Any

import pytest

import workers.compose as compose_module
from services.settings import Settings
from workers.app import encodings_at_start
from workers.compose import compose
from workers.metrics import FleetMetrics


class _Connection:
    """The NATS client as composition uses it: contexts are made, nothing is sent."""

    def jetstream(self, timeout: float) -> object:
        return object()


def _compose(monkeypatch: pytest.MonkeyPatch, workers: str) -> tuple[compose_module.Workers, list[Any]]:
    made: list[Any] = []
    real = compose_module.ViewLoader

    def counted(**options: Any) -> Any:
        made.append(real(**options))
        return made[-1]

    monkeypatch.setattr(compose_module, "ViewLoader", counted)
    built = compose(
        Settings(workers=workers), ("nats://localhost:4222",), object(), _Connection(), FleetMetrics()
    )  # type: ignore[arg-type]
    return built, made


def test_the_assembler_budgeter_and_compactor_of_a_process_share_one_view_loader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built, made = _compose(monkeypatch, "recorder,assembler,budgeter,compactor,indexer")
    assert len(made) == 1 and built.loader is made[0]
    assert built.recorder is not None and built.budgeter is not None and built.indexer is not None


def test_a_process_builds_only_the_workers_its_settings_name(monkeypatch: pytest.MonkeyPatch) -> None:
    built, _ = _compose(monkeypatch, "assembler")
    assert (built.recorder, built.budgeter, built.indexer) == (None, None, None)
    assert built.responder is not None and "ctx.prepare.*.*.*" in built.responder.subjects
    assert built.broker.subscribers, "the assembler's notice subscribers are on the broker"
    alone, _ = _compose(monkeypatch, "indexer")
    assert alone.indexer is not None and alone.recorder is None and alone.budgeter is None


def test_a_process_with_a_compactor_loads_both_tokenizers_before_it_serves() -> None:
    # The compactor counts every summary in both encodings: left to its first compaction, loading
    # cl100k stalled the event loop for ~140 ms. Without one, cl100k waits for a reader that needs it.
    assert encodings_at_start(["recorder", "assembler", "compactor"]) == ("o200k_base", "cl100k_base")
    assert encodings_at_start(["recorder", "assembler", "budgeter", "indexer"]) == ("o200k_base",)
