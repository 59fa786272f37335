"""Supervision's restart budget, the data-folder lock and process identity, without servers."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra.datafolder import (
    DataFolderBusy,
    ServerRecord,
    lock_data_folder,
    read_server_records,
    write_server_records,
)
from infra.embedded import EmbeddedServerError, ProcessIdentity, describe_exit
from infra.supervise import RESTART_WINDOW_S, ServerDied, supervise
from tests.fixtures.fleet import eventually

pytestmark = pytest.mark.anyio


@dataclass
class FakeServer:
    """Dies ``deaths`` times (each restart brings it back), or fails to restart when told to."""

    name: str = "nats-server"
    log_path: Path = Path("/data/nats/nats.log")
    deaths: int = 0
    restart_fails: bool = False
    restarts: list[float] = field(default_factory=list)
    # Reasons to restart it although it runs (a store that met a full disk), one per look.
    wants_restart: list[str] = field(default_factory=list)

    def is_running(self) -> bool:
        return self.deaths <= 0

    def exit_status(self) -> str:
        return "killed by SIGKILL"

    def tend(self) -> str | None:
        return self.wants_restart.pop(0) if self.wants_restart else None

    def restart(self, timeout: float = 15.0) -> str:
        if self.restart_fails:
            raise EmbeddedServerError("port 4222 in use")
        self.deaths -= 1
        self.restarts.append(timeout)
        return "nats://127.0.0.1:4222"


async def _supervise_briefly(server: FakeServer, restarts: int) -> None:
    await asyncio.wait_for(
        supervise([server], restarts=restarts, interval_s=0.001, clock=lambda: 0.0), timeout=0.5
    )


async def test_supervise_restarts_a_dead_server_and_keeps_watching() -> None:
    server = FakeServer(deaths=2)
    recorded: list[int] = []
    task = asyncio.create_task(
        supervise(
            [server], restarts=3, interval_s=0.001, on_restart=lambda: recorded.append(len(server.restarts))
        )
    )
    try:

        async def running() -> bool:
            return server.is_running()

        await eventually(running, timeout=1, what="the server restarted")
        assert len(server.restarts) == 2 and recorded == [1, 2] and not task.done()
    finally:
        task.cancel()


async def test_supervise_restarts_a_running_server_its_upkeep_asks_to_restart_within_the_budget() -> None:
    server = FakeServer(wants_restart=["stopped writing its store (no space left on device)"] * 2)
    with pytest.raises(ServerDied) as caught:
        await _supervise_briefly(server, restarts=1)
    assert len(server.restarts) == 1  # the second ask is past the budget
    assert str(caught.value).startswith(
        "nats-server stopped writing its store (no space left on device) and "
    )


async def test_supervise_raises_server_died_naming_server_and_log_past_the_restart_budget() -> None:
    server = FakeServer(deaths=3)
    with pytest.raises(ServerDied) as caught:
        await _supervise_briefly(server, restarts=2)
    assert len(server.restarts) == 2
    assert str(caught.value) == (
        "nats-server killed by SIGKILL and was restarted 2 times in the last 10 minutes already; "
        "the fleet stopped. Its log: /data/nats/nats.log"
    )


async def test_supervise_forgets_restarts_older_than_the_window() -> None:
    server = FakeServer(deaths=3)
    # Each death comes a window and a bit after the last: the budget of one restart is never spent.
    times = iter(n * (RESTART_WINDOW_S + 1) for n in range(100))
    task = asyncio.create_task(supervise([server], restarts=1, interval_s=0.001, clock=lambda: next(times)))
    try:

        async def running() -> bool:
            return server.is_running()

        await eventually(running, timeout=1, what="the server restarted")
        assert len(server.restarts) == 3 and not task.done()
    finally:
        task.cancel()


async def test_supervise_with_restarts_off_stops_on_the_first_exit() -> None:
    with pytest.raises(ServerDied, match=r"restarts are off \(CTX_SERVER_RESTARTS=0\)"):
        await _supervise_briefly(FakeServer(deaths=1), restarts=0)


async def test_supervise_raises_server_died_when_a_restart_fails() -> None:
    with pytest.raises(ServerDied, match=r"could not be restarted \(port 4222 in use\)"):
        await _supervise_briefly(FakeServer(deaths=1, restart_fails=True), restarts=3)


def test_lock_data_folder_refuses_a_second_holder_and_names_the_first(tmp_path: Path) -> None:
    lock = lock_data_folder(tmp_path)
    try:
        with pytest.raises(DataFolderBusy, match=f"in use by another 'ctxfleet up' \\(pid {os.getpid()}\\)"):
            lock_data_folder(tmp_path)
    finally:
        lock.release()
    lock_data_folder(tmp_path).release()  # free again once released


def test_process_identity_does_not_match_a_reused_pid() -> None:
    me = ProcessIdentity.of(os.getpid())
    assert me is not None and me.is_running()
    # Same PID, another start time: what a PID reused after a crash looks like.
    assert not ProcessIdentity(me.pid, me.create_time - 60).is_running()


def test_server_records_round_trip_and_a_damaged_file_reads_as_none(tmp_path: Path) -> None:
    record = ServerRecord("nats-server", 123, 1.5, "/d/nats", "/d/nats/nats.log", 4222)
    write_server_records(tmp_path, [record])
    assert read_server_records(tmp_path) == {"nats-server": record}
    (tmp_path / "servers.json").write_text('{"nats-server": {"pid": ')
    assert read_server_records(tmp_path) == {}


@pytest.mark.parametrize(("code", "text"), [(None, "exited"), (1, "exit code 1"), (-9, "killed by SIGKILL")])
def test_describe_exit_says_how_a_server_ended(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


def test_process_identity_matches_a_start_time_read_a_boot_second_apart() -> None:
    # Another process derives the same start from a btime it read a second apart: still this process.
    me = ProcessIdentity.of(os.getpid())
    assert me is not None
    assert ProcessIdentity(me.pid, me.create_time + 1.0).is_running()
    assert ProcessIdentity(me.pid, me.create_time - 1.0).is_running()
