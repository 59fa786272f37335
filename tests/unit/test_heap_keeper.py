"""What the heap keeper freezes stays freeable: refcounting frees it at once, a sweep frees cycles."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from workers.heap import HeapKeeper
from workers.app import encodings_at_start


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


@pytest.fixture(autouse=True)
def _thawed() -> object:
    yield
    gc.unfreeze()  # the rest of the suite runs with the heap as it found it


def test_a_frozen_object_is_still_freed_when_nothing_holds_it() -> None:
    keeper = HeapKeeper(5.0, 900.0)
    node = _Node()
    alive = weakref.ref(node)
    keeper.freeze()
    assert gc.get_freeze_count() > 0
    del node
    assert alive() is None


def test_a_frozen_cycle_waits_for_the_sweep_and_the_sweep_frees_it() -> None:
    keeper = HeapKeeper(5.0, 900.0)
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    keeper.freeze()
    del a, b
    gc.collect()
    assert alive() is not None  # frozen: a collection does not walk it
    keeper.sweep()
    assert alive() is None and keeper.sweeps == 1 and gc.get_freeze_count() > 0


async def _until_frozen_twice(keeper: HeapKeeper) -> None:
    # Each freeze first collects what is not frozen: in a large test process that takes a while.
    for _ in range(500):
        if keeper.freezes >= 2:
            return
        await asyncio.sleep(0.01)


@pytest.mark.anyio
async def test_the_keeper_freezes_on_its_interval_and_stops() -> None:
    keeper = HeapKeeper(0.01, 900.0)
    keeper.start()
    await _until_frozen_twice(keeper)
    await keeper.stop()
    frozen = keeper.freezes
    assert frozen >= 2
    await asyncio.sleep(0.05)
    assert keeper.freezes == frozen


def test_a_cycle_dropped_before_the_freeze_is_collected_not_frozen() -> None:
    keeper = HeapKeeper(5.0, 900.0)
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    del a, b
    pause = keeper.freeze()
    assert alive() is None and pause >= 0 and keeper.freezes == 1


@pytest.mark.anyio
async def test_the_keeper_turns_the_allocators_full_collections_off_until_the_last_keeper_stops() -> None:
    # A full collection started by an allocation lands inside whatever runs then, a prepare included.
    before = gc.get_threshold()
    first, second = HeapKeeper(5.0, 900.0), HeapKeeper(5.0, 900.0)
    first.start()
    second.start()
    assert gc.get_threshold()[:2] == before[:2]
    assert gc.get_threshold()[2] >= 1_000_000
    await first.stop()
    assert gc.get_threshold()[2] >= 1_000_000  # the second fleet of the process still runs
    await second.stop()
    assert gc.get_threshold() == before


@pytest.mark.anyio
async def test_each_collection_waits_for_a_quiet_moment() -> None:
    waits = 0

    async def quiet() -> None:
        nonlocal waits
        waits += 1
        await asyncio.sleep(0)

    keeper = HeapKeeper(0.01, 900.0, quiet=quiet)
    keeper.start()
    await _until_frozen_twice(keeper)
    await keeper.stop()
    assert keeper.freezes >= 2
    assert waits >= keeper.freezes


@pytest.mark.anyio
async def test_an_interval_of_zero_never_freezes() -> None:
    before = gc.get_threshold()
    keeper = HeapKeeper(0.0, 900.0)
    keeper.start()
    assert gc.get_threshold() == before  # nobody would run full collections
    await asyncio.sleep(0.02)
    await keeper.stop()
    assert keeper.freezes == 0


def test_a_process_with_a_compactor_loads_both_tokenizers_before_it_serves() -> None:
    # The compactor counts every summary in both encodings: left to its first compaction, loading
    # cl100k stalled the event loop for ~140 ms. Without one, cl100k waits for a reader that needs it.
    assert encodings_at_start(["recorder", "assembler", "compactor"]) == ("o200k_base", "cl100k_base")
    assert encodings_at_start(["recorder", "assembler", "budgeter", "indexer"]) == ("o200k_base",)
