"""The embedded default is closed: generated identities only, each confined to its subjects."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from contracts import ContextPolicy, PrepareRequest
from infra import SAMPLES_DIR
from infra.credentials import CREDENTIALS_FILE, as_identity, load_credentials
from infra.runtime import Servers, start_fleet, start_servers
from ctxfleet_client.client import FleetClient
from contracts.exceptions import FleetUnavailable, PermissionDenied
from services.edge.replay import ReplayOptions, replay_trace
from services.settings import Settings
from services.core.trace import read_trace
from tests.fixtures.fleet import make_settings

pytestmark = [pytest.mark.anyio, pytest.mark.nats, pytest.mark.pg]


def prepare_request_for(thread_id: str) -> PrepareRequest:
    run_id, instance_id = thread_id.split(".")
    return PrepareRequest(session_id="closed-s1", run_id=run_id, instance_id=instance_id, budget_tokens=3_000)


SAMPLE = SAMPLES_DIR / "tau-bench__gpt-4o-airline_task024_trial0.jsonl"


@pytest.fixture
async def embedded(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Settings, Servers]]:
    """The embedded default's broker (as `ctxfleet up` starts it) beside the test's PostgreSQL."""
    settings = make_settings(None, database_url, tmp_path)  # type: ignore[arg-type]
    servers = await asyncio.to_thread(start_servers, settings)
    try:
        yield settings, servers
    finally:
        await asyncio.to_thread(servers.stop)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_an_anonymous_client_cannot_connect_and_secrets_are_the_owners_alone(
    embedded: tuple[Settings, Servers],
) -> None:
    settings, servers = embedded
    with pytest.raises(FleetUnavailable):
        await FleetClient.connect(servers.nats_urls)
    with pytest.raises(FleetUnavailable):
        await FleetClient.connect(servers.nats_urls, user="runtime-default", password="guessed")
    assert _mode(settings.embedded.data_dir / CREDENTIALS_FILE) == 0o600
    assert (
        _mode(settings.embedded.data_dir / "nats") == 0o700
        and _mode(settings.embedded.data_dir / "nats" / "nats.conf") == 0o600
    )
    assert _mode(settings.embedded.data_dir) & 0o077 in (0, 0o011)  # nobody else may list the folder


async def test_the_fleet_and_a_runtime_work_under_their_generated_identities(
    embedded: tuple[Settings, Servers],
) -> None:
    settings, servers = embedded
    fleet = await start_fleet(settings, servers)
    try:
        # The CLI's replay inspects the thread at its end: it runs as the operator.
        operator = as_identity(settings, "operator")
        assert operator.bus.nats_user == "operator"
        async with await FleetClient.connect(servers.nats_urls, **operator.bus.nats_options()) as client:
            policy = ContextPolicy(name="closed-3000", model_profile=None, budget_tokens=3_000)
            await client.register_policy(policy)
            report = await replay_trace(
                client, read_trace(SAMPLE), ReplayOptions(session_id="closed-s1", policy=policy.name)
            )
        assert report.totals["errors"] == 0 and report.totals["prepares"] == 19
        # A runtime prepares the same thread; it may not inspect it.
        async with await FleetClient.connect(
            servers.nats_urls, **as_identity(settings, "runtime-default").bus.nats_options()
        ) as client:
            thread = "closed-s1-r1.main"
            prepared = await client.prepare(prepare_request_for(thread))
            assert prepared.messages
            started = time.monotonic()
            with pytest.raises(PermissionDenied) as denied:
                await client.inspect(thread, limit=1)
            assert time.monotonic() - started < 2.0  # at once, not after the request's 10 s timeout
            assert denied.value.code.value == "permission_denied" and not denied.value.retryable
    finally:
        await fleet.stop()
    # The fleet's own identity never needed more than its grants
    # (the runtime's refusal above is the only one).
    violations = [
        line
        for line in (settings.embedded.data_dir / "nats" / "nats.log").read_text().splitlines()
        if "Violation" in line
    ]
    assert all("user:runtime-default" in line and "ctx.inspect." in line for line in violations), violations


async def test_a_runtime_cannot_answer_prepares_touch_jetstream_put_jobs_or_forge_notices(
    embedded: tuple[Settings, Servers],
) -> None:
    settings, servers = embedded
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    creds = load_credentials(settings.embedded.data_dir)
    assert creds is not None
    nc = await nats.connect(
        list(servers.nats_urls),
        user="runtime-default",
        password=creds.password("runtime-default"),
        error_cb=on_error,
        inbox_prefix="_INBOX.runtime-default",
    )
    try:
        await nc.subscribe("ctx.prepare.>")
        await nc.subscribe(">")
        await nc.subscribe("_INBOX.>")  # other clients' replies
        await nc.publish("ctx.compaction.jobs", b"{}")
        await nc.publish("ctx.recorded.r1.main", b"{}")
        await nc.flush()
        with pytest.raises((NoRespondersError, NatsTimeout)):
            await nc.request("$JS.API.STREAM.UPDATE.CTX_EVENTS", b"{}", timeout=1.0)
        await asyncio.sleep(0.3)
    finally:
        await nc.close()
    assert any("permissions violation" in str(e).lower() for e in errors)
    logged = "\n".join(
        line
        for line in (settings.embedded.data_dir / "nats" / "nats.log").read_text().splitlines()
        if "Violation" in line
    )
    for subject in (
        "ctx.prepare.>",
        "_INBOX.>",
        "ctx.compaction.jobs",
        "ctx.recorded.r1.main",
        "STREAM.UPDATE",
    ):
        assert subject in logged, (subject, logged)


def test_ctxfleet_env_prints_the_lines_a_client_in_another_language_needs(server_folder: Path) -> None:
    data = server_folder / "data"
    env = {**os.environ, "CTX_DATA_DIR": str(data)}
    env.pop("CTX_NATS_URL", None)
    env.pop("CTX_DATABASE_URL", None)
    up = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "up", "--no-replay"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if line.startswith("ctxfleet: serving"):
                break
        out = subprocess.run(
            [sys.executable, "-m", "infra.cli", "env"], env=env, capture_output=True, text=True, check=True
        ).stdout
        lines = dict(line.split("=", 1) for line in out.splitlines())
        assert set(lines) == {"CTX_NATS_URL", "CTX_NATS_USER", "CTX_NATS_PASSWORD", "CTX_TENANT"}
        assert lines["CTX_NATS_USER"] == "runtime-default" and lines["CTX_TENANT"] == "default"
        # A second terminal built by `eval "$(ctxfleet env)"` gets every line again, the tenant named
        # after the command as the CLI prints it; a tenant without an identity gets none of them.
        again = subprocess.run(
            [sys.executable, "-m", "infra.cli", "env", "--tenant", "default"],
            env=env | lines,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert again == out
        unknown = subprocess.run(
            [sys.executable, "-m", "infra.cli", "env", "--tenant", "nobody"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert (unknown.returncode, unknown.stdout) == (2, ""), unknown.stderr

        async def register() -> int:
            async with await FleetClient.connect(
                lines["CTX_NATS_URL"],
                user=lines["CTX_NATS_USER"],
                password=lines["CTX_NATS_PASSWORD"],
                tenant=lines["CTX_TENANT"],
            ) as client:
                return (
                    await client.register_policy(
                        ContextPolicy(name="env-check", model_profile=None, budget_tokens=1_000)
                    )
                ).revision

        assert asyncio.run(register()) >= 1
        # And the CLI in a second terminal finds its identity by itself.
        replay = subprocess.run(
            [sys.executable, "-m", "infra.cli", "replay", str(SAMPLE)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert replay.returncode == 0 and "0 errors" in replay.stdout, replay.stdout + replay.stderr
    finally:
        up.terminate()
        up.wait(timeout=60)
        if up.stdout is not None:
            up.stdout.close()


async def test_the_embedded_postgres_requires_its_generated_password_across_restarts(
    server_folder: Path,
) -> None:
    import asyncpg

    settings = Settings(data_dir=server_folder / "data")
    for _ in range(2):  # the second start finds a cluster already switched to passwords
        servers = await asyncio.to_thread(start_servers, settings)
        try:
            url = servers.database_url
            creds = load_credentials(settings.embedded.data_dir)
            assert (
                creds is not None and creds.postgres and f":{creds.postgres}@" in url
            )  # url-safe: never escaped
            conn = await asyncpg.connect(url)
            assert await conn.fetchval("SELECT 1") == 1
            await conn.close()
            with pytest.raises(asyncpg.InvalidPasswordError):
                await asyncpg.connect(url.replace(f":{creds.postgres}@", ":@", 1))
        finally:
            await asyncio.to_thread(servers.stop)
