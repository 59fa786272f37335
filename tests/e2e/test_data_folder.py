"""`ctxfleet up` owns its data folder: one fleet per folder, orphans cleared, servers supervised.

Each test drives `ctxfleet up` as a subprocess on embedded servers in a fresh data folder, the way
an operator runs `make run`, and kills processes the way a crash or the OOM killer would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest

from infra import SAMPLES_DIR
from infra.datafolder import holders_of
from infra.embedded import free_port
from infra.credentials import load_credentials
from ctxfleet_client.client import FleetClient
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]
ROOT = Path(__file__).resolve().parents[2]
# The longest bundled trace, replayed three times: long enough that a Ctrl-C lands mid-replay.
LONG_SAMPLE = SAMPLES_DIR / "mini-swe-agent-deepseek__deepseek_chat_dev__sqlfluff__sqlfluff-2419.jsonl"


class Up:
    """One `ctxfleet up` process on a data folder, its output in a file."""

    def __init__(self, tmp: Path, *args: str, **env: str) -> None:
        self.data = tmp / "data"
        self.http_port = free_port()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
        self.env.update(
            CTX_DATA_DIR=str(self.data), CTX_PARTITIONS="4", CTX_HTTP_PORT=str(self.http_port), **env
        )
        self.log = tmp / f"up-{time.monotonic_ns()}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "infra.cli", "up", *args],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def output(self) -> str:
        return self.log.read_text()

    def servers(self) -> dict[str, dict[str, object]]:
        return json.loads((self.data / "servers.json").read_text())

    async def wait_for(self, text: str, timeout: float = 60) -> None:
        async def printed() -> bool:
            assert self.proc.poll() is None or text in self.output, (
                f"up exited {self.proc.returncode}:\n{self.output}"
            )
            return text in self.output

        await eventually(printed, timeout=timeout, what=f"{text!r} from ctxfleet up")

    async def ready(self) -> bool:
        def get() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/readyz", timeout=2) as reply:
                    return reply.status == 200
            except (urllib.error.URLError, OSError):
                return False

        return await asyncio.to_thread(get)

    def interrupt(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def folder(server_folder: Path) -> Iterator[Path]:
    """A fresh data folder's parent; afterwards no server may be left running on it."""
    yield server_folder
    for store in (server_folder / "data" / "nats", server_folder / "data" / "postgres"):
        for proc in holders_of(store) if store.exists() else []:
            proc.kill()


def _server_processes(store: Path, name: str) -> list[psutil.Process]:
    """The servers (not their children: PostgreSQL backends) called ``name`` running on ``store``."""
    found = []
    for proc in holders_of(store):
        try:
            parent = proc.parent()
            if proc.name() == name and (parent is None or parent.name() != name):
                found.append(proc)
        except psutil.NoSuchProcess:
            continue
    return found


async def _recorded(database_url: str, thread_id: str) -> list[tuple[str, int]]:
    """``(event_key, times recorded)`` of each event of the thread in the ledger."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT event_key, count(*) AS n FROM ctx.records WHERE thread_id = $1 GROUP BY event_key "
            "ORDER BY event_key",
            thread_id,
        )
    except asyncpg.UndefinedTableError:
        return []
    finally:
        await conn.close()
    return [(r["event_key"], r["n"]) for r in rows]


async def test_up_refuses_a_second_up_on_a_locked_data_folder_and_names_the_holder(folder: Path) -> None:
    first = Up(folder, "--no-replay")
    try:
        await first.wait_for("serving")
        started = time.monotonic()
        second = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "infra.cli", "up", "--no-replay"],
            cwd=ROOT,
            env=first.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "in use" in lines[0] and f"pid {first.proc.pid}" in lines[0], second.stderr
        assert time.monotonic() - started < 15  # refused at once: it started nothing
        assert len(_server_processes(first.data / "nats", "nats-server")) == 1
        assert await first.ready()
        assert first.interrupt() == 0
    finally:
        first.kill()


async def test_up_after_sigkill_stops_the_orphans_and_records_what_they_acked_exactly_once(
    folder: Path,
) -> None:
    thread = Thread()
    events = [thread.system(), thread.user("hello"), thread.assistant("hi"), thread.user("and again")]
    crashed = Up(folder, "--no-replay")
    try:
        await crashed.wait_for("serving")
        orphans = crashed.servers()
        url = json.loads((crashed.data / "endpoints.json").read_text())["database_url"]
        runtime = load_credentials(crashed.data)
        assert runtime is not None  # the broker is closed: a runtime connects as the generated `runtime` user
        async with await FleetClient.connect(
            f"nats://127.0.0.1:{orphans['nats-server']['port']}",
            user="runtime-default",
            password=runtime.password("runtime-default"),
        ) as client:
            for event in events[:2]:  # recorded by the fleet before it dies
                await client.append(event)

            async def first_two_recorded() -> bool:
                return len(await _recorded(url, thread.thread_id)) == 2

            await eventually(first_two_recorded, timeout=30, what="the first events to be recorded")
            crashed.kill()  # SIGKILL of `up` alone: its servers run on, in their own sessions
            assert all(psutil.pid_exists(int(s["pid"])) for s in orphans.values())
            assert (crashed.data / "postgres" / ".handle_pids.json").read_text() == f"[{crashed.proc.pid}]"
            # A runtime still connected to the orphaned broker: its events are acked, nobody records them.
            for event in events[2:]:
                await client.append(event)
    finally:
        crashed.kill()

    restarted = Up(folder, "--no-replay")
    try:
        await restarted.wait_for("serving")
        assert "stopped servers a previous run" in restarted.output
        assert not any(psutil.pid_exists(int(s["pid"])) for s in orphans.values())
        brokers = _server_processes(restarted.data / "nats", "nats-server")
        assert [p.pid for p in brokers] == [restarted.servers()["nats-server"]["pid"]]
        url = json.loads((restarted.data / "endpoints.json").read_text())["database_url"]

        async def all_recorded() -> bool:
            return len(await _recorded(url, thread.thread_id)) == len(events)

        await eventually(all_recorded, timeout=30, what="the orphan-acked events to be recorded")
        assert await _recorded(url, thread.thread_id) == sorted((e.event_key, 1) for e in events)
        assert restarted.interrupt() == 0
        # The crashed run's PID no longer pins the cluster: a clean stop now stops PostgreSQL.
        assert _server_processes(restarted.data / "postgres", "postgres") == []
        assert _server_processes(restarted.data / "nats", "nats-server") == []
    finally:
        restarted.kill()


@pytest.mark.parametrize("server", ["nats-server", "postgres"])
async def test_up_restarts_a_killed_embedded_server_and_is_ready_again(folder: Path, server: str) -> None:
    up = Up(folder, "--no-replay")
    try:
        await up.wait_for("serving")
        await eventually(up.ready, timeout=30, what="/readyz")
        before = up.servers()[server]
        killed = time.monotonic()
        os.kill(int(before["pid"]), signal.SIGKILL)

        async def back() -> bool:
            return up.servers()[server]["pid"] != before["pid"] and await up.ready()

        await eventually(back, timeout=30, what=f"{server} restarted and /readyz ready")
        print(f"{server}: kill -9 to /readyz ready in {time.monotonic() - killed:.2f}s")
        assert up.servers()[server].get("port") == before.get("port")  # same address: clients reconnect
        assert f"{server} killed by SIGKILL" in up.output or f"{server} exited" in up.output
        assert up.interrupt() == 0 and "stopped cleanly" in up.output
    finally:
        up.kill()


async def test_up_with_restarts_off_stops_with_one_line_naming_the_dead_server_and_its_log(
    folder: Path,
) -> None:
    up = Up(folder, "--no-replay", CTX_SERVER_RESTARTS="0")
    try:
        await up.wait_for("serving")
        os.kill(int(up.servers()["nats-server"]["pid"]), signal.SIGKILL)
        assert up.proc.wait(timeout=60) == 2
        last = up.output.strip().splitlines()[-1]
        assert last.startswith("ctxfleet: nats-server killed by SIGKILL and restarts are off"), up.output
        assert str(up.data / "nats" / "nats.log") in last
        assert _server_processes(up.data / "postgres", "postgres") == []
    finally:
        up.kill()


async def test_ctrl_c_during_the_startup_replay_stops_the_fleet_cleanly(folder: Path) -> None:
    up = Up(folder, *(["--replay", str(LONG_SAMPLE)] * 3))
    try:
        await up.wait_for("ctxfleet: up in")
        assert up.interrupt(timeout=60) == 0
        out = up.output
        assert "interrupted" in out and "stopped cleanly" in out, out
        assert "replayed" not in out and "Traceback" not in out, out
        assert _server_processes(up.data / "nats", "nats-server") == []
        assert _server_processes(up.data / "postgres", "postgres") == []
    finally:
        up.kill()


async def test_a_failing_startup_replay_is_reported_in_one_line_and_the_fleet_keeps_serving(
    folder: Path,
) -> None:
    bad = folder / "bad.jsonl"
    bad.write_text('{"kind": "user_input", "text": "fine"}\nnot json at all\n')
    up = Up(folder, "--replay", str(bad))
    try:
        await up.wait_for("serving")
        failed = [line for line in up.output.splitlines() if "failed" in line]
        assert len(failed) == 1 and "bad.jsonl" in failed[0] and "keeps serving" in failed[0], up.output
        assert "Traceback" not in up.output
        await eventually(up.ready, timeout=30, what="/readyz after the failed replay")
        assert up.interrupt() == 0 and "stopped cleanly" in up.output
    finally:
        up.kill()
