"""`ctxfleet up` (what `make run` starts) serves the console and prints where, without being asked to."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.fleet import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]
ROOT = Path(__file__).resolve().parents[2]
_CONSOLE_LINE = re.compile(r"ctxfleet: console (http://127\.0\.0\.1:\d+/console/)")


def _start_up(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "infra.cli", "up", "--no-replay"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def test_up_prints_the_console_url_and_serves_the_console_there(server_folder: Path) -> None:
    tmp_path = server_folder
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(CTX_DATA_DIR=str(tmp_path / "data"), CTX_PARTITIONS="4")  # no CTX_HTTP_PORT
    log = tmp_path / "up.log"
    proc = _start_up(env, log)
    try:

        async def printed() -> bool:
            assert proc.poll() is None, f"up exited {proc.returncode}:\n{log.read_text()}"
            return _CONSOLE_LINE.search(log.read_text()) is not None

        await eventually(printed, timeout=90, what="the console line from ctxfleet up")
        found = _CONSOLE_LINE.search(log.read_text())
        assert found is not None
        url = found.group(1)

        def get() -> tuple[int, str]:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return reply.status, reply.read().decode()

        status, page = await asyncio.to_thread(get)
        assert status == 200 and "<h1>Sessions</h1>" in page and 'id="sessions"' in page
        proc.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(proc.wait, 60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
