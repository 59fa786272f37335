"""A fleet in its own process, as deployed, so a benchmark's load generator never shares its event loop.

``FleetProcess`` spawns ``ctxfleet worker NAMES…`` against already migrated and provisioned servers,
waits for ``/readyz``, and measures the process from outside: CPU seconds (psutil) and resident
memory (``VmRSS``). The benchmark process measures its own CPU the same way, so a figure can say
whether the generator, not the fleet, was the bound.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

from infra.embedded import free_port
from infra.runtime import migrate, provision
from services.settings import Settings, parse_nats_urls

__all__ = [
    "ALL_WORKERS",
    "CpuMeter",
    "FleetProcess",
    "MachineCpu",
    "fleet_env",
    "prepare_servers",
    "spawn_worker",
    "wait_ready",
]

ROOT = Path(__file__).resolve().parents[1]
_CTXFLEET = Path(sys.executable).parent / "ctxfleet"
ALL_WORKERS: tuple[str, ...] = ("recorder", "assembler", "budgeter", "compactor", "indexer")


def spawn_worker(
    env: dict[str, str], names: tuple[str, ...] | list[str], log: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """``ctxfleet worker NAMES…`` started (not yet ready), its output appended to ``log``; the process
    and the port of its operations endpoint."""
    port = free_port()
    command = [str(_CTXFLEET)] if _CTXFLEET.exists() else [sys.executable, "-m", "infra.cli"]
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [*command, "worker", *names],
            cwd=ROOT,
            env={**env, "CTX_HTTP_PORT": str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, port


def wait_ready(proc: subprocess.Popen[bytes], port: int, timeout: float = 60.0) -> None:
    """Block until the worker answers 200 on ``/readyz``; raise if it exits or takes ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ctxfleet worker exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
                if reply.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.05)
    raise RuntimeError(f"ctxfleet worker not ready within {timeout}s")


async def prepare_servers(nats_url: str, database_url: str, data_dir: Path) -> None:
    """Migrations and streams, done once by the benchmark as the migration Job would."""
    await migrate(database_url)
    await provision(
        parse_nats_urls(nats_url), Settings(nats_url=nats_url, database_url=database_url, data_dir=data_dir)
    )


def fleet_env(nats_url: str, database_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    """The worker's environment: this one without its ``CTX_*``, the servers, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(CTX_NATS_URL=nats_url, CTX_DATABASE_URL=database_url, CTX_DATA_DIR=str(data_dir))
    env.update(extra)
    return env


@dataclass
class CpuMeter:
    """CPU seconds per wall second of one process between ``start()`` and ``stop()``."""

    process: psutil.Process
    _cpu: float = 0.0
    _wall: float = 0.0
    cores: float = field(default=0.0, init=False)

    def start(self) -> None:
        times = self.process.cpu_times()
        self._cpu, self._wall = times.user + times.system, time.perf_counter()

    def stop(self) -> float:
        times = self.process.cpu_times()
        wall = time.perf_counter() - self._wall
        self.cores = round((times.user + times.system - self._cpu) / wall, 3) if wall > 0 else 0.0
        return self.cores


@dataclass
class MachineCpu:
    """Busy cores of the whole machine between ``start()`` and ``stop()``: the servers, and whatever
    else runs here (on a shared machine, other people's work), beside the fleet and the generator."""

    _busy: float = 0.0
    _wall: float = 0.0

    @staticmethod
    def _busy_now() -> float:
        times = psutil.cpu_times()
        return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))

    def start(self) -> None:
        self._busy, self._wall = self._busy_now(), time.perf_counter()

    def stop(self) -> float:
        wall = time.perf_counter() - self._wall
        return round((self._busy_now() - self._busy) / wall, 3) if wall > 0 else 0.0


class FleetProcess:
    """``ctxfleet worker NAMES…`` as a child process, ready on exit from ``__enter__``."""

    def __init__(self, names: tuple[str, ...], env: dict[str, str], log: Path) -> None:
        self.names = names
        self._proc, self.port = spawn_worker(env, names, log)
        self.process = psutil.Process(self._proc.pid)

    def __enter__(self) -> FleetProcess:
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        wait_ready(self._proc, self.port, timeout)

    def rss_mb(self) -> float:
        """Resident memory now (``VmRSS`` of /proc/<pid>/status), in MB."""
        with open(f"/proc/{self._proc.pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS line")

    def cpu(self) -> CpuMeter:
        return CpuMeter(self.process)

    def metrics(self) -> str:
        """The process's Prometheus exposition text, as an operator's scrape reads it."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    def stop(self) -> None:
        if self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
