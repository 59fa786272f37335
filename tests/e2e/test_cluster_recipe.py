"""docs/operating.md, "A 3-node JetStream cluster", as a user runs it: `ctxfleet cluster --nodes 3
--postgres`, then `migrate` and `provision` with its lines, two `ctxfleet worker` processes given all
three URLs, and a replay through them (the CLI's commands each parse the URLs alike:
tests/unit/test_nats_urls.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from contracts.subjects import EVENTS_STREAM
from infra import SAMPLES_DIR
from ctxfleet_client.client import FleetClient
from tests.fixtures.processes import ALL_WORKERS, ROOT, WorkerProcess

pytestmark = [pytest.mark.pg, pytest.mark.nats]

SAMPLE = SAMPLES_DIR / "swe-agent__marshmallow-1867_function_calling_replace_from_source.jsonl"


@dataclass
class RunningCluster:
    env: dict[str, str]  # a second terminal's, after `set -a; . DIR/cluster.env; set +a`
    lines: dict[str, str]
    proc: subprocess.Popen[str]


def _ctxfleet(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _read_env_file(path: Path) -> dict[str, str]:
    lines = {}
    for line in path.read_text().splitlines():
        name, _, value = shlex.split(line)[0].partition("=")
        lines[name] = value
    return lines


@pytest.fixture
def running_cluster() -> Iterator[RunningCluster]:
    # Traversable by the embedded PostgreSQL's own user when the suite runs as root (not pytest's 0700).
    root = Path(tempfile.mkdtemp(prefix="ctx-cluster-recipe-"))
    root.chmod(0o755)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infra.cli",
            "cluster",
            "--nodes",
            "3",
            "--postgres",
            "--dir",
            str(root / "c"),
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("CTX_")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    env_file = root / "c" / "cluster.env"
    try:
        deadline = time.monotonic() + 90
        while not env_file.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the cluster did not come up within 90 s"
            time.sleep(0.1)
        lines = _read_env_file(env_file)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
        env.update(lines, CTX_DATA_DIR=str(root / "data"))
        yield RunningCluster(env, lines, proc)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        err = proc.communicate(timeout=60)[1]
        shutil.rmtree(root, ignore_errors=True)
    assert proc.returncode == 0, err
    assert "cluster stopped" in err and not env_file.exists()
    # Every node it started is gone with it.
    pids = [int(pid) for pid in re.findall(r"\bpid (\d+)", err)]
    assert len(pids) >= 3 and not any(psutil.pid_exists(pid) for pid in pids), err


def test_the_documented_cluster_recipe_serves_the_cli_from_two_workers_on_r3_streams(
    running_cluster: RunningCluster, tmp_path: Path
) -> None:
    env, lines = running_cluster.env, running_cluster.lines
    urls = lines["CTX_NATS_URL"].split(",")
    assert len(urls) == 3 and lines["CTX_STREAM_REPLICAS"] == "3"
    assert lines["CTX_DATABASE_URL"].startswith("postgresql://")
    for command in (("migrate",), ("provision",)):
        done = _ctxfleet(*command, env=env)
        assert done.returncode == 0, done.stderr
    workers = [
        WorkerProcess({**env, "CTX_RECORDER_PARTITIONS": f"{i}/2"}, tmp_path / f"worker-{i}", ALL_WORKERS)
        for i in range(2)
    ]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            asyncio.run(worker.wait_ready(timeout=60))
        report = tmp_path / "report.json"
        replay = _ctxfleet("replay", str(SAMPLE), "--report", str(report), "-q", env=env)
        assert replay.returncode == 0, replay.stderr
        totals = json.loads(report.read_text())["totals"]
        assert totals["errors"] == 0 and totals["prepares"] > 0
        assert all(w.proc is not None and w.proc.poll() is None for w in workers)
        asyncio.run(
            _assert_r3_streams_and_a_verified_chain(lines["CTX_NATS_URL"], f"{totals['session_id']}-r1.main")
        )
    finally:
        for worker in workers:
            assert worker.stop() == 0, worker.log.read_text()[-2000:]


async def _assert_r3_streams_and_a_verified_chain(servers: str, thread: str) -> None:
    # The Python client, given CTX_NATS_URL as the recipe's lines say it.
    async with await FleetClient.connect(servers) as client:
        info = await client._nc.jetstream(timeout=10.0).stream_info(EVENTS_STREAM)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and len(info.cluster.replicas or ()) == 2
        assert (await client.inspect(thread)).chain_verified
