"""One fleet per data folder, one server per fleet: `up` uses only the servers it started.

Another checkout's `make run` may hold the port our nats-server was to listen on (it was free when
chosen); our server then cannot bind it, and the fleet must never connect to the one answering
there. And the embedded PostgreSQL's start leaves the data folder as private as it was.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import runtime
from infra.embedded import EmbeddedNats, PortTaken, free_port, server_info
from infra.runtime import start_servers
from services.settings import Settings
from tests.fixtures.fleet import eventually, make_settings
from tests.fixtures.processes import readyz

pytestmark = [pytest.mark.anyio, pytest.mark.nats]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stranger(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """Another checkout's embedded nats-server, in a folder of its own."""
    server = EmbeddedNats(tmp_path / "other-checkout" / "nats")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_embedded_nats_refuses_a_port_another_nats_server_holds_and_never_returns_its_url(
    stranger: EmbeddedNats, tmp_path: Path
) -> None:
    ours = EmbeddedNats(tmp_path / "nats", port=stranger.port)
    with pytest.raises(PortTaken) as taken:
        ours.start()
    message = str(taken.value)
    assert f"port {stranger.port} is taken" in message and stranger.server_name in message
    assert "\n" not in message and "CTX_NATS_PORT" in message
    assert not ours.is_running()
    info = server_info(stranger.port)
    assert info is not None and info["server_name"] == stranger.server_name  # the stranger is untouched


@pytest.mark.pg
def test_start_servers_moves_to_a_free_port_when_another_server_takes_the_chosen_one_first(
    stranger: EmbeddedNats, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race of two checkouts starting at once: the port was free when checked, taken at bind.
    monkeypatch.setattr(runtime, "port_is_free", lambda port: True)
    settings = make_settings(None, database_url, tmp_path, nats_port=stranger.port)  # type: ignore[arg-type]
    servers = start_servers(settings)
    try:
        (broker,) = servers.owned
        assert isinstance(broker, EmbeddedNats)
        assert servers.nats_urls == (broker.url,) and broker.port != stranger.port
        info = server_info(broker.port)
        assert info is not None and info["server_name"] == broker.server_name != stranger.server_name
    finally:
        servers.stop()


@pytest.mark.pg
def test_the_data_folder_stays_0711_after_the_embedded_postgres_starts() -> None:
    # Outside pytest's temporary root, which pytest keeps 0700 whatever a test does.
    root = Path(tempfile.mkdtemp(prefix="ctx-test-mode-"))
    try:
        assert _mode(root) == 0o700
        settings = Settings(data_dir=root / "data", nats_url="nats://127.0.0.1:1")
        servers = start_servers(settings)
        try:
            assert _mode(settings.embedded.data_dir) == 0o711  # nobody else may list it
            # Its parent gains traversal only, which the embedded PostgreSQL's own user needs.
            assert _mode(root) == 0o711
        finally:
            servers.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _up(data: Path, nats_port: int, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    http_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(
        CTX_DATA_DIR=str(data),
        CTX_PARTITIONS="2",
        CTX_HTTP_PORT=str(http_port),
        CTX_NATS_PORT=str(nats_port),
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "up", "--no-replay"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, http_port


@pytest.mark.pg
async def test_two_ups_started_at_once_on_one_port_each_serve_on_their_own_server(
    server_folder: Path, tmp_path: Path
) -> None:
    port = free_port()
    root = server_folder
    ups = [_up(root / f"checkout-{i}" / ".ctxfleet", port, tmp_path / f"up-{i}.log") for i in range(2)]
    try:

        async def both_ready() -> bool:
            for i, (proc, _) in enumerate(ups):
                assert proc.poll() is None, (tmp_path / f"up-{i}.log").read_text()
            return all([await asyncio.to_thread(readyz, http_port) == 200 for _, http_port in ups])

        await eventually(both_ready, timeout=120, what="both fleets ready")
        names = []
        for i in range(2):
            data = root / f"checkout-{i}" / ".ctxfleet"
            url = json.loads((data / "endpoints.json").read_text())["nats_url"]
            info = server_info(int(url.rsplit(":", 1)[1]))
            assert info is not None
            names.append(info["server_name"])
            assert "Traceback" not in (tmp_path / f"up-{i}.log").read_text()
            assert _mode(data) == 0o711  # after a real start, PostgreSQL included
        assert len(set(names)) == 2  # each fleet on the server it started
    finally:
        for proc, _ in ups:
            proc.terminate()
        deadline = time.monotonic() + 60
        for proc, _ in ups:
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()


def test_up_on_a_read_only_data_folder_fails_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    bound = subprocess.run(["mount", "--bind", str(data), str(data)], capture_output=True, text=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(data)], check=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
        env["CTX_DATA_DIR"] = str(data)
        up = subprocess.run(
            [sys.executable, "-m", "infra.cli", "up", "--no-replay"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert up.returncode == 2
        assert up.stderr.splitlines() == [f"ctxfleet: Read-only file system: {data / 'up.lock'}"], up.stderr
    finally:
        subprocess.run(["umount", str(data)], check=False)
