"""The fleet connects with each NATS authentication method, and over TLS, against a real server."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nkeys
import pytest

from infra.embedded import EmbeddedNats
from infra.provision import ProvisionResult
from infra.runtime import provision
from contracts.exceptions import FleetUnavailable
from services.settings import load_settings
from tests.fixtures.nats_jwt import mint_jwt_setup
from workers.app import Fleet

pytestmark = [pytest.mark.anyio, pytest.mark.nats]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in list(os.environ):
        if name.startswith("CTX_"):
            monkeypatch.delenv(name)
    yield monkeypatch


async def _provision_as(
    url: str, tmp: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> ProvisionResult:
    """Settings read from the environment as a worker would, then a real JetStream round trip."""
    for name, value in {
        "CTX_NATS_URL": url,
        "CTX_PARTITIONS": "4",
        "CTX_DATA_DIR": str(tmp / "data"),
        **env,
    }.items():
        monkeypatch.setenv(name, value)
    return await provision((url,), load_settings())


async def _start(tmp: Path, config: str) -> EmbeddedNats:
    server = EmbeddedNats(tmp / "nats", extra_config=config)
    await asyncio.to_thread(server.start)
    return server


async def test_token_authentication_from_a_secret_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t0ken-from-a-mounted-secret\n")
    server = await _start(tmp_path, 'authorization { token: "t0ken-from-a-mounted-secret" }')
    try:
        result = await _provision_as(
            server.url, tmp_path, {"CTX_NATS_TOKEN_FILE": str(token_file)}, clean_env
        )
        assert result.events == "created"
        with pytest.raises(FleetUnavailable, match="[Aa]uthorization"):
            await _provision_as(
                server.url, tmp_path, {"CTX_NATS_TOKEN_FILE": "", "CTX_NATS_TOKEN": "wrong"}, clean_env
            )
    finally:
        await asyncio.to_thread(server.stop)


async def test_nkey_authentication_with_a_seed_file(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(seed + b"\n")
    server = await _start(tmp_path, f'authorization {{ users: [ {{ nkey: "{public}" }} ] }}')
    try:
        result = await _provision_as(
            server.url, tmp_path, {"CTX_NATS_NKEY_SEED_FILE": str(seed_file)}, clean_env
        )
        assert result.events == "created"
    finally:
        await asyncio.to_thread(server.stop)


def _make_certificates(folder: Path) -> dict[str, Path]:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate (openssl CLI)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=ctxfleet-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    for name in ("server", "client"):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            f"{name}.pem",
        )
    return {n: folder / n for n in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl command to make test certificates"
)
async def test_mutual_tls_verifies_the_server_and_presents_a_client_certificate(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    certs = await asyncio.to_thread(_make_certificates, tmp_path)
    config = (
        f'tls {{ cert_file: "{certs["server.pem"]}", key_file: "{certs["server.key"]}", '
        f'ca_file: "{certs["ca.pem"]}", verify: true }}'
    )
    server = await _start(tmp_path, config)
    url = server.url.replace("nats://", "tls://")
    tls: dict[str, Any] = {
        "CTX_NATS_TLS_CA_FILE": str(certs["ca.pem"]),
        "CTX_NATS_TLS_CERT_FILE": str(certs["client.pem"]),
        "CTX_NATS_TLS_KEY_FILE": str(certs["client.key"]),
    }
    try:
        result = await _provision_as(url, tmp_path, tls, clean_env)
        assert result.events == "created"
        # Without the client certificate the server (verify: true) refuses the handshake.
        clean_env.delenv("CTX_NATS_TLS_CERT_FILE")
        clean_env.delenv("CTX_NATS_TLS_KEY_FILE")
        with pytest.raises(FleetUnavailable, match="cannot connect to NATS"):
            await asyncio.wait_for(provision((url,), load_settings()), timeout=20)
    finally:
        await asyncio.to_thread(server.stop)


@pytest.mark.pg
async def test_a_creds_file_authenticates_provisioning_and_a_running_fleet(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, database_url: str
) -> None:
    setup = mint_jwt_setup(tmp_path)
    server = await _start(tmp_path, setup.server_config)
    fleet: Fleet | None = None
    try:
        result = await _provision_as(
            server.url, tmp_path, {"CTX_NATS_CREDS_FILE": str(setup.creds_file)}, clean_env
        )
        assert result.events == "created"
        # The FastStream broker authenticates separately (NatsCredentials):
        # the compactor and assembler use it.
        clean_env.setenv("CTX_WORKERS", "recorder,assembler,compactor")
        fleet = Fleet(load_settings(), nats_urls=(server.url,), database_url=database_url)
        await fleet.start()
        checks = await fleet.readiness()
        assert checks["broker"] is None and checks["nats"] is None, checks
    finally:
        if fleet is not None:
            await fleet.stop()
        await asyncio.to_thread(server.stop)
