"""``ctxfleet cluster``: an N-node JetStream cluster on loopback (and a PostgreSQL), for the fleet's
workers to be run against as ``ctxfleet worker`` processes (docs/operating.md, "A 3-node JetStream
cluster")."""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from services.settings import Settings

from .credentials import DATA_FOLDER_MODE, secure_folder
from .embedded import EmbeddedNats, EmbeddedPostgres
from .nats_cluster import NatsCluster

__all__ = ["ENV_FILE", "add_cluster_command"]

# The CTX_* lines of the running cluster, for `set -a; . DIR/cluster.env; set +a` in other terminals.
ENV_FILE = "cluster.env"
_PASSWORD_FILE = "postgres.password"
_WATCH_S = 0.5


def add_cluster_command(sub: Any) -> None:
    cluster = sub.add_parser(
        "cluster", help="run an N-node JetStream cluster on loopback (and a PostgreSQL) until Ctrl-C"
    )
    cluster.add_argument(
        "--nodes", type=int, choices=range(1, 10), default=3, metavar="N", help="nats-servers (default 3)"
    )
    cluster.add_argument(
        "--dir", type=Path, help="the nodes' stores and ports (default: <CTX_DATA_DIR>/cluster)"
    )
    cluster.add_argument(
        "--postgres", action="store_true", help="also run an embedded PostgreSQL under the same folder"
    )
    cluster.set_defaults(func=_cmd_cluster)


def _cmd_cluster(args: argparse.Namespace, settings: Settings) -> int:
    root: Path = args.dir or settings.embedded.data_dir / "cluster"
    # Traversable by the embedded PostgreSQL's own user when we are root; listing refused to others.
    secure_folder(root, DATA_FOLDER_MODE)
    nats = NatsCluster(root / "nats", size=args.nodes, sync_always=settings.embedded.nats_sync_always)
    postgres = EmbeddedPostgres(root / "postgres", sole_owner=True, password=_password(root))
    stopping: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        urls = nats.start()
        lines = {"CTX_NATS_URL": ",".join(urls), "CTX_STREAM_REPLICAS": str(min(args.nodes, 3))}
        if args.postgres:
            lines["CTX_DATABASE_URL"] = postgres.start()
        _write_env(root / ENV_FILE, lines)
        for i, node in enumerate(nats.nodes):
            print(
                f"ctxfleet: {nats.server_name(i)} {_pid(node)}, {node.url}, store {node.store}",
                file=sys.stderr,
            )
        for name, value in lines.items():
            print(f"{name}={shlex.quote(value)}", flush=True)
        print(
            f"ctxfleet: cluster up; these lines are in {root / ENV_FILE}. Ctrl-C stops it.", file=sys.stderr
        )
        while not stopping:
            _restart_exited(nats)
            time.sleep(_WATCH_S)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        (root / ENV_FILE).unlink(missing_ok=True)
        nats.stop()
        if args.postgres:
            postgres.stop()
    print("ctxfleet: cluster stopped", file=sys.stderr)
    return 0


def _restart_exited(nats: NatsCluster) -> None:
    """A node that exited (killed, say) is started again on its ports and store: it rejoins the
    cluster and catches up from its peers, as a node under a process supervisor would."""
    for i, node in enumerate(nats.nodes):
        if not node.is_running():
            said = node.exit_status()
            nats.start_node(i)
            print(f"ctxfleet: {nats.server_name(i)} {said}; started again, {_pid(node)}", file=sys.stderr)


def _pid(node: EmbeddedNats) -> str:
    identity = node.identity()
    return f"pid {identity.pid}" if identity is not None else "not running"


def _password(root: Path) -> str:
    """The embedded PostgreSQL superuser's password, made once per folder (the cluster keeps it)."""
    path = root / _PASSWORD_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(24))
    return path.read_text().strip()


def _write_env(path: Path, lines: dict[str, str]) -> None:
    # It may hold the database password: the owner's alone, and complete or absent.
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{name}={shlex.quote(value)}\n" for name, value in lines.items())
    tmp.replace(path)
