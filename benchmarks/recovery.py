"""Time from a dead embedded server to a ready fleet again, under ``ctxfleet up``'s supervision.

For each server (nats-server, PostgreSQL) and each round: start ``ctxfleet up --no-replay`` on a
fresh data folder with ``CTX_HTTP_PORT``, wait for ``/readyz`` 200, SIGKILL the server's PID as
recorded in ``.ctxfleet/servers.json``, and time until ``/readyz`` is 200 again (polled every
20 ms). The supervisor restarts the server on the same port or socket; workers reconnect.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from infra.embedded import free_port

__all__ = ["bench_recovery"]

_ROOT = Path(__file__).resolve().parent.parent
_BOUND_S = 60.0


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait(predicate: object, what: str) -> None:
    started = time.monotonic()
    while not predicate():  # type: ignore[operator]
        if time.monotonic() - started > _BOUND_S:
            raise RuntimeError(f"{what} not within {_BOUND_S:.0f}s")
        time.sleep(0.02)


def _server_pid(data_dir: Path, name: str) -> int:
    listed = json.loads((data_dir / "servers.json").read_text())
    if name not in listed:
        raise RuntimeError(f"{name} not in {data_dir / 'servers.json'}: {sorted(listed)}")
    return int(listed[name]["pid"])


def _one_round(name: str) -> float:
    data_dir = Path(tempfile.mkdtemp(prefix="ctx-recovery-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(CTX_DATA_DIR=str(data_dir), CTX_HTTP_PORT=str(port))
    up = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "up", "--no-replay"],
        cwd=_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: _ready(port), "first ready")
        os.kill(_server_pid(data_dir, name), signal.SIGKILL)
        killed = time.monotonic()
        # Readiness may not notice a death faster than a poll; start the clock at the kill anyway.
        _wait(lambda: not _ready(port) or time.monotonic() - killed > 5, "unready")
        _wait(lambda: _ready(port), "ready again")
        return round(time.monotonic() - killed, 2)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            up.kill()
        shutil.rmtree(data_dir, ignore_errors=True)


def bench_recovery(rounds: int = 3) -> dict[str, list[float]]:
    """Seconds from SIGKILL of each embedded server to ``/readyz`` 200, per round."""
    return {name: [_one_round(name) for _ in range(rounds)] for name in ("nats-server", "postgres")}


if __name__ == "__main__":
    print(json.dumps(bench_recovery()))
