"""This process's recorder tells its listeners which threads it holds a batch of, and when it lets go."""

from __future__ import annotations

import pytest

from workers.local_notices import LocalNotices


def test_a_thread_is_being_recorded_until_every_batch_holding_it_is_let_go() -> None:
    local = LocalNotices()
    released: list[str] = []
    local.listen_released(released.append)
    with local.recording({"r.a", "r.b"}):
        with local.recording({"r.a"}):  # another partition's batch with the same thread
            assert local.is_recording("r.a") and local.is_recording("r.b")
        assert released == ["r.a"]
        assert local.is_recording("r.a")
    assert not local.is_recording("r.a") and not local.is_recording("r.b")
    assert sorted(released) == ["r.a", "r.a", "r.b"]


def test_a_batch_that_fails_is_let_go_and_its_waiters_are_woken() -> None:
    local = LocalNotices()
    released: list[str] = []
    local.listen_released(released.append)
    with pytest.raises(RuntimeError):
        with local.recording({"r.a"}):
            raise RuntimeError("store unavailable")
    assert released == ["r.a"] and not local.is_recording("r.a")
