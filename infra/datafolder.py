"""One fleet per data folder: the lock ``ctxfleet up`` holds, and the servers a crashed run left.

Invariants, each kept by one function:

1. At most one ``ctxfleet up`` runs on a data folder (``lock_data_folder``: ``flock`` on
   ``up.lock``, held for the process lifetime; the kernel releases it on any death, so a crash
   never leaves a stale lock behind, unlike a PID file).
2. Every embedded server started is written down with its PID and start time
   (``write_server_records``), so a later run can tell its own orphan from a PID reused since.
3. Nothing new starts on a store an earlier server still holds (``clear_orphans``): the recorded
   servers are stopped (SIGTERM for nats-server, SIGINT — PostgreSQL's fast shutdown — for the
   postmaster; SIGKILL after a bound), then any ``nats-server`` or ``postgres`` process still
   naming, working in or holding a file under a store is stopped the same way.

Orphans are stopped rather than adopted. Adopting would save about a second, but an adopted
server is not our child (no exit code, no ``wait``), runs whatever config the crashed build wrote,
and may have been half-way through its own shutdown; a clean stop flushes the JetStream store and
the restart runs with this build's config, on the recorded port when it is still free.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from .embedded import EmbeddedServerError, ProcessIdentity, remove_stale_pg_locks, stop_process

__all__ = [
    "LOCK_FILE",
    "SERVERS_FILE",
    "DataFolderBusy",
    "DataFolderLock",
    "ServerRecord",
    "clear_orphans",
    "forget_server_records",
    "holders_of",
    "lock_data_folder",
    "read_server_records",
    "write_server_records",
]

log = logging.getLogger("ctxfleet")
LOCK_FILE = "up.lock"
SERVERS_FILE = "servers.json"
# The only processes an orphan scan may ever signal: a `tail -f nats.log` or a shell sitting in the
# folder also "holds" it, and must be left alone.
_SERVER_NAMES = frozenset({"nats-server", "postgres"})


class DataFolderBusy(EmbeddedServerError):
    """Another ``ctxfleet up`` holds this data folder."""

    def __init__(self, data_dir: Path, holder: int | None) -> None:
        who = f"pid {holder}" if holder is not None else "a process whose pid is not recorded"
        super().__init__(
            f"data folder {data_dir} is in use by another 'ctxfleet up' ({who}): stop it first "
            "(Ctrl-C in its terminal), use it from here (ctxfleet replay/inspect/search), or set CTX_DATA_DIR"
        )
        self.data_dir = data_dir
        self.holder = holder


@dataclass
class DataFolderLock:
    """The exclusive lock on a data folder; release it (or exit) to let another ``up`` start."""

    path: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def lock_data_folder(data_dir: Path) -> DataFolderLock:
    """Take the folder's lock at once or raise ``DataFolderBusy`` naming the holder's PID."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_FILE
    # os.open descriptors are not inherited (PEP 446): a nats-server we start must never hold the
    # lock after we die, or the next run would wait for our orphan instead of stopping it.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        raise DataFolderBusy(data_dir, holder) from None
    except BaseException:
        os.close(fd)
        raise
    if os.fstat(fd).st_ino != _inode(path):
        # The folder was removed (or the file replaced) between open and flock: our lock guards a
        # file nobody else will ever open. Try again on the file that is there now.
        os.close(fd)
        return lock_data_folder(data_dir)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DataFolderLock(path, fd)


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class ServerRecord:
    """An embedded server as started: who it is, what store it holds, where it listens and logs."""

    name: str
    pid: int
    create_time: float
    store: str
    log: str
    port: int | None = None

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.create_time)


def write_server_records(data_dir: Path, records: list[ServerRecord]) -> None:
    """Replace the folder's server list (atomically: a crash mid-write leaves the old one)."""
    tmp = data_dir / (SERVERS_FILE + ".tmp")
    tmp.write_text(json.dumps({r.name: asdict(r) for r in records}, indent=1) + "\n")
    tmp.replace(data_dir / SERVERS_FILE)


def read_server_records(data_dir: Path) -> dict[str, ServerRecord]:
    """The servers the last run of this folder started (empty if none, or the file is unreadable)."""
    try:
        raw = json.loads((data_dir / SERVERS_FILE).read_text())
        return {name: ServerRecord(**fields) for name, fields in raw.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        # A damaged list must not stop the run: the scan of the stores below still finds orphans.
        log.warning("ignoring unreadable %s: %s", data_dir / SERVERS_FILE, exc)
        return {}


def forget_server_records(data_dir: Path) -> None:
    (data_dir / SERVERS_FILE).unlink(missing_ok=True)


def holders_of(store: Path) -> list[psutil.Process]:
    """Every ``nats-server``/``postgres`` process that names, works in, or has a file open under ``store``."""
    where = str(store.resolve())
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["name", "cmdline", "cwd"]):
        if proc.pid == os.getpid() or proc.info["name"] not in _SERVER_NAMES:
            continue
        args = proc.info["cmdline"] or []
        if (
            any(_mentions(arg, where) for arg in args)
            or _under(proc.info["cwd"], where)
            or _has_open_file_under(proc, where)
        ):
            found.append(proc)
    return found


def _mentions(arg: str, where: str) -> bool:
    # `-c <store>/nats.conf`, `--store_dir=<store>`, `-D <store>`; not `<store>-other/...`.
    return arg.endswith(where) or where + os.sep in arg


def _under(path: str | None, where: str) -> bool:
    return path is not None and (path == where or path.startswith(where + os.sep))


def _has_open_file_under(proc: psutil.Process, where: str) -> bool:
    try:
        return any(_under(f.path, where) for f in proc.open_files())
    except psutil.Error:
        return False


def clear_orphans(data_dir: Path, stores: list[Path], timeout: float) -> list[str]:
    """Stop every server a crashed run of ``data_dir`` left; returns what was stopped, for the log.

    Call it only while holding the folder's lock: it signals whatever runs on these stores.

    Raises:
        EmbeddedServerError: a process still holds a store after SIGKILL (another user's, say).
    """
    stopped: list[str] = []
    for record in read_server_records(data_dir).values():
        proc = record.identity.process()
        if proc is not None:
            stop_process(proc, _graceful(record.name), timeout)
            stopped.append(
                f"{record.name} (pid {record.pid}, port {record.port})"
                if record.port
                else f"{record.name} (pid {record.pid})"
            )
    for store in stores:
        holders = holders_of(store) if store.exists() else []
        pids = {p.pid for p in holders}
        # Only the servers themselves get the graceful signal (SIGINT would merely cancel a
        # backend's query); their children follow them out, and are killed if they linger.
        leaders = [p for p in holders if _parent(p) not in pids]
        for proc in leaders:
            stop_process(proc, _graceful(_name(proc)), timeout)
            stopped.append(f"{_name(proc)} (pid {proc.pid}) on {store}")
        _, lingering = psutil.wait_procs([p for p in holders if p not in leaders], timeout=timeout)
        for proc in lingering:
            stop_process(proc, signal.SIGKILL, timeout)
        left = holders_of(store) if store.exists() else []
        if left:
            who = ", ".join(f"pid {p.pid} ({_name(p)})" for p in left)
            raise EmbeddedServerError(
                f"{store} is still held by {who}; stop it, then run 'ctxfleet up' again"
            )
    # No postmaster runs on the cluster now: a PID in its lock files could only be a dead or reused
    # one, which the wheel would take for a running server and PostgreSQL for a rival postmaster.
    remove_stale_pg_locks(data_dir / "postgres")
    forget_server_records(data_dir)
    return stopped


def _parent(proc: psutil.Process) -> int | None:
    try:
        return int(proc.ppid())
    except psutil.Error:
        return None


def _name(proc: psutil.Process) -> str:
    try:
        return str(proc.name())
    except psutil.Error:
        return "?"


def _graceful(name: str) -> signal.Signals:
    # PostgreSQL's SIGTERM is a "smart" shutdown that waits for every client (a second terminal's
    # `ctxfleet worker`, say) to leave; SIGINT is the fast one pg_ctl stop uses.
    return signal.SIGINT if name == "postgres" else signal.SIGTERM
