"""The image entrypoint, as Kubernetes runs it: `ctxfleet worker <name>`, probes, and SIGTERM."""

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
import pytest

from infra.embedded import EmbeddedNats, free_port
from contracts import PrepareRequest
from ctxfleet_client.client import FleetClient
from contracts.exceptions import Overloaded
from services.settings import WORKER_NAMES
from tests.fixtures.builders import Thread
from tests.fixtures.fleet import TEST_PARTITIONS, eventually
from tests.fixtures.servers import with_database

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]

ROOT = Path(__file__).resolve().parents[2]
# The console script the image's ENTRYPOINT runs; `python -m infra.cli` where it is not installed.
CTXFLEET = (
    [str(Path(sys.executable).parent / "ctxfleet")]
    if (Path(sys.executable).parent / "ctxfleet").exists()
    else [sys.executable, "-m", "infra.cli"]
)
SHUTDOWN_BOUND_S = 10.0


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


class Worker:
    """One `ctxfleet worker` process with its operations port."""

    def __init__(self, name: str, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [*CTXFLEET, "worker", name],
                cwd=ROOT,
                env={**env, "CTX_HTTP_PORT": str(self.port)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_ready(self, timeout: float = 60.0) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"worker exited {self.proc.returncode}: {self.log.read_text()}"
            try:
                status, body = _get(self.port, "/readyz")
            except OSError:
                time.sleep(0.05)
                continue
            if status == 200:
                return dict(json.loads(body))
            time.sleep(0.05)
        raise AssertionError(f"not ready within {timeout}s: {self.log.read_text()}")

    def terminate(self) -> tuple[int, float]:
        """SIGTERM; the exit code and how long the drain took."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=SHUTDOWN_BOUND_S + 20)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def worker_env(streams: str, database_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(
        CTX_NATS_URL=streams,
        CTX_DATABASE_URL=database_url,
        CTX_PARTITIONS=str(TEST_PARTITIONS),
        CTX_DATA_DIR=str(tmp_path / "data"),
        CTX_SHUTDOWN_TIMEOUT_S=str(SHUTDOWN_BOUND_S),
        CTX_LOG_LEVEL="INFO",
    )
    yield env


@pytest.mark.parametrize("name", WORKER_NAMES)
async def test_the_entrypoint_starts_each_worker_ready_and_sigterm_exits_cleanly(
    name: str, worker_env: dict[str, str], tmp_path: Path
) -> None:
    worker = Worker(name, worker_env, tmp_path / f"{name}.log")
    try:
        checks = await asyncio.to_thread(worker.wait_ready)
        assert checks["ready"] is True
        assert checks["checks"] == {
            "nats": "ok",
            "broker": "ok",
            "postgres": "ok",
            "jetstream": "ok",
            "consumers": "ok",
        }
        assert await asyncio.to_thread(_get, worker.port, "/healthz") == (200, "ok\n")
        status, metrics = await asyncio.to_thread(_get, worker.port, "/metrics")
        assert status == 200 and "ctx_consumer_lag_events" in metrics
        code, took = await asyncio.to_thread(worker.terminate)
    finally:
        worker.kill()
    assert code == 0, worker.log.read_text()
    assert took < SHUTDOWN_BOUND_S
    assert "drained in" in worker.log.read_text()


async def test_sigterm_during_a_burst_loses_and_duplicates_nothing(
    worker_env: dict[str, str], client: FleetClient, db: asyncpg.Connection, tmp_path: Path
) -> None:
    env = {**worker_env, "CTX_RECORD_BATCH": "25"}
    first = Worker("recorder", env, tmp_path / "first.log")
    threads, per_thread = [Thread() for _ in range(30)], 80
    try:
        await asyncio.to_thread(first.wait_ready)

        async def publish(t: Thread) -> None:
            for i in range(per_thread):
                await client.append(t.user(f"{t.run_id} message {i}", key=f"m{i:04d}"))

        # Still publishing when SIGTERM comes: a recorder that keeps up would otherwise have
        # recorded the whole burst before it.
        publishing = asyncio.gather(*(publish(t) for t in threads))

        async def started() -> bool:
            return int(await db.fetchval("SELECT count(*) FROM ctx.records")) >= 200

        await eventually(started, timeout=60, what="the first records")
        code, took = await asyncio.to_thread(first.terminate)
        await publishing
    finally:
        first.kill()
    assert code == 0 and took < SHUTDOWN_BOUND_S, first.log.read_text()
    total = len(threads) * per_thread
    assert int(await db.fetchval("SELECT count(*) FROM ctx.records")) < total, (
        "the burst was over before SIGTERM"
    )

    second = Worker("recorder", env, tmp_path / "second.log")
    try:
        await asyncio.to_thread(second.wait_ready)

        async def done() -> bool:
            return int(await db.fetchval("SELECT count(*) FROM ctx.records")) >= total

        await eventually(done, timeout=60, what=f"all {total} records")
        await asyncio.sleep(0.5)  # anything recorded twice would land now
    finally:
        second.kill()
    assert int(await db.fetchval("SELECT count(*) FROM ctx.records")) == total
    for t in threads:
        rows = await db.fetch(
            "SELECT seq, event_key FROM ctx.records WHERE thread_id=$1 ORDER BY seq", t.thread_id
        )
        assert [r["event_key"] for r in rows] == [f"m{i:04d}" for i in range(per_thread)]
        assert [r["seq"] for r in rows] == list(range(1, per_thread + 1))
    assert await db.fetchval("SELECT count(*) FROM ctx.dead_letters") == 0


async def test_readiness_turns_503_with_the_reason_when_postgres_goes_away(start_fleet) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    fleet = await start_fleet(http_port=port)

    async def ready() -> bool:
        return (await asyncio.to_thread(_get, port, "/readyz"))[0] == 200

    await eventually(ready, what="ready: every recorder partition bound")
    assert fleet.pool is not None
    fleet.pool.terminate()
    status, body = await asyncio.to_thread(_get, port, "/readyz")
    assert status == 503
    checks = json.loads(body)["checks"]
    assert checks["postgres"] != "ok" and checks["nats"] == "ok"
    assert (await asyncio.to_thread(_get, port, "/healthz"))[0] == 200  # alive: a restart would not help


def _run_worker(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CTXFLEET, "worker", name], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


async def test_a_worker_refuses_an_unmigrated_database_and_names_the_fix(
    worker_env: dict[str, str], pg_server_url: str
) -> None:
    name = f"ctx_empty_{os.getpid()}"
    conn = await asyncpg.connect(pg_server_url)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {name}")
        await conn.execute(f"CREATE DATABASE {name}")
        env = {**worker_env, "CTX_DATABASE_URL": with_database(pg_server_url, name)}
        result = await asyncio.to_thread(_run_worker, "assembler", env)
    finally:
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await conn.close()
    assert result.returncode == 2
    assert "lacks migrations 0001_baseline.sql" in result.stderr and "ctxfleet migrate" in result.stderr
    assert "Traceback" not in result.stderr


async def test_a_worker_refuses_a_broker_without_the_fleet_streams_and_names_the_fix(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    bare = EmbeddedNats(tmp_path / "bare-nats")
    url = await asyncio.to_thread(bare.start)
    try:
        result = await asyncio.to_thread(_run_worker, "compactor", {**worker_env, "CTX_NATS_URL": url})
    finally:
        await asyncio.to_thread(bare.stop)
    assert result.returncode == 2
    assert "ctxfleet provision" in result.stderr and "Traceback" not in result.stderr


async def test_an_assembler_stopping_mid_load_answers_every_prepare_it_took(
    start_fleet, client: FleetClient
) -> None:  # type: ignore[no-untyped-def]
    await start_fleet(workers="recorder")
    leaving = await start_fleet(workers="assembler", recorder_id="leaving")
    await start_fleet(workers="assembler", recorder_id="staying")
    threads = [Thread() for _ in range(20)]
    for t in threads:
        await client.append(t.system("Be brief."))
        await client.append(t.user("what changed?", key="q"))

    async def prepare(t: Thread) -> str:
        request = PrepareRequest(
            session_id=t.session_id,
            run_id=t.run_id,
            instance_id="main",
            budget_tokens=4000,
            after_event_key="q",
        )
        while True:
            try:
                return (await client.prepare(request)).messages[-1].content  # type: ignore[return-value]
            except Overloaded as busy:
                # The staying assembler sheds what it cannot start in time, as it should under 300
                # prepares at once; a runtime retries after the hint. A prepare the leaving one took
                # and dropped would time out instead, and fail the test.
                await asyncio.sleep(max(busy.retry_after_ms, 10) / 1000)

    load = asyncio.gather(*(prepare(t) for t in threads * 15))
    await asyncio.sleep(0.05)
    await leaving.stop()  # what SIGTERM does, in this process
    answers = await load
    assert answers == ["what changed?"] * len(threads) * 15


async def test_secrets_never_reach_the_log_even_at_debug_level(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    secrets = {
        "CTX_DATABASE_PASSWORD": "pg-Secret-4711",
        "CTX_SUMMARIZER_API_KEY": "sk-Secret-4712",
        "CTX_NATS_PASSWORD": "nats-Secret-4713",
    }
    # The test servers ignore credentials (trust auth, no NATS authorization), so the worker still starts.
    env = {**worker_env, **secrets, "CTX_NATS_USER": "assembler", "CTX_LOG_LEVEL": "DEBUG"}
    worker = Worker("assembler", env, tmp_path / "debug.log")
    try:
        await asyncio.to_thread(worker.wait_ready)
        status, page = await asyncio.to_thread(_get, worker.port, "/metrics")
        await asyncio.to_thread(worker.terminate)
    finally:
        worker.kill()
    log = worker.log.read_text()
    assert "DEBUG" in log  # the level really was DEBUG: the check below looked at everything
    for value in secrets.values():
        assert value not in log and value not in page


async def test_a_worker_that_cannot_reach_postgres_says_where_without_the_password(
    worker_env: dict[str, str],
) -> None:
    port = free_port()  # nothing listens here
    env = {**worker_env, "CTX_DATABASE_URL": f"postgresql://app:pw-Secret-99@127.0.0.1:{port}/ctx"}
    result = await asyncio.to_thread(_run_worker, "indexer", env)
    assert result.returncode == 2
    assert f"cannot connect to PostgreSQL at postgresql://app:***@127.0.0.1:{port}/ctx" in result.stderr
    assert "pw-Secret-99" not in result.stderr and "Traceback" not in result.stderr


async def test_a_taken_http_port_is_a_clear_startup_error(worker_env: dict[str, str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = await asyncio.to_thread(_run_worker, "budgeter", {**worker_env, "CTX_HTTP_PORT": str(port)})
    assert result.returncode == 2
    assert (
        f"CTX_HTTP_PORT: cannot listen on 127.0.0.1:{port}" in result.stderr
        and "Traceback" not in result.stderr
    )


async def test_a_broker_restart_turns_readiness_503_then_the_worker_reconnects_and_records_again(
    database_url: str, tmp_path: Path
) -> None:
    from infra.runtime import provision
    from tests.fixtures.fleet import make_settings
    from workers.app import Fleet

    broker = EmbeddedNats(tmp_path / "own-nats")
    url = await asyncio.to_thread(broker.start)
    port = free_port()
    settings = make_settings(url, database_url, tmp_path, http_port=port, workers="recorder,assembler")
    fleet = Fleet(settings, nats_urls=(url,), database_url=database_url)
    try:
        await provision((url,), settings)
        await fleet.start()

        async def status() -> int:
            return (await asyncio.to_thread(_get, port, "/readyz"))[0]

        async def ready() -> bool:
            return await status() == 200

        await eventually(ready, what="ready")
        await asyncio.to_thread(broker.stop)

        async def unready() -> bool:
            return await status() == 503

        await eventually(unready, what="503 while NATS is down")
        _, body = await asyncio.to_thread(_get, port, "/readyz")
        assert json.loads(body)["checks"]["nats"] == "not connected"
        await asyncio.to_thread(broker.start)  # same port, same JetStream store
        await eventually(ready, timeout=30, what="ready again after the broker came back")
        async with await FleetClient.connect(url) as client:
            t = Thread()
            await client.append(t.user("after the restart", key="k"))
            prepared = await client.prepare(
                PrepareRequest(
                    session_id=t.session_id,
                    run_id=t.run_id,
                    instance_id="main",
                    budget_tokens=1000,
                    after_event_key="k",
                )
            )
        assert prepared.messages[-1].content == "after the restart"
    finally:
        await fleet.stop()
        await asyncio.to_thread(broker.stop)


async def test_with_a_startup_wait_a_worker_is_live_unready_until_the_migrations_land(
    worker_env: dict[str, str], pg_server_url: str, tmp_path: Path
) -> None:
    from infra.runtime import migrate

    name = f"ctx_late_{os.getpid()}"
    conn = await asyncpg.connect(pg_server_url)
    await conn.execute(f"DROP DATABASE IF EXISTS {name}")
    await conn.execute(f"CREATE DATABASE {name}")
    url = with_database(pg_server_url, name)
    worker = Worker(
        "compactor",
        {**worker_env, "CTX_DATABASE_URL": url, "CTX_STARTUP_WAIT_S": "60"},
        tmp_path / "late.log",
    )
    try:

        async def waiting() -> bool:
            try:
                status, body = await asyncio.to_thread(_get, worker.port, "/readyz")
            except OSError:
                return False
            return status == 503 and "lacks migrations" in json.loads(body)["checks"].get("startup", "")

        await eventually(waiting, timeout=30, what="503 naming the missing migrations")
        assert (await asyncio.to_thread(_get, worker.port, "/healthz"))[0] == 200
        await migrate(url)  # what the migration Job does
        checks = await asyncio.to_thread(worker.wait_ready)
        assert checks["ready"] is True and "startup" not in checks["checks"]
        code, _ = await asyncio.to_thread(worker.terminate)
        assert code == 0
    finally:
        worker.kill()
        await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await conn.close()
