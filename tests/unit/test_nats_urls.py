"""CTX_NATS_URL names one server or a cluster's, comma-separated: read once into a tuple of URLs,
refused by name when malformed, its credentials used for every server, and every URL reaching the
connection, the workers' broker, ``ctxfleet env`` and the AsyncAPI document."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from infra.asyncapi import asyncapi_document
from infra.cli import main
from ctxfleet_client.client import FleetClient
from contracts.exceptions import InvalidConfiguration
from services.settings import Settings, load_settings, nats_connection, parse_nats_urls
from workers.compose import create_broker

CLUSTER = "nats://127.0.0.1:14301,nats://127.0.0.1:14302,nats://127.0.0.1:14303"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("CTX_"):
            monkeypatch.delenv(name)


def test_nats_url_names_one_server_or_each_server_of_a_cluster_whitespace_around_them_ignored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTX_NATS_URL", " nats://a:4222 ,\tnats://b:4222,  tls://c:4223 ")
    assert load_settings().bus.nats_url == ("nats://a:4222", "nats://b:4222", "tls://c:4223")
    monkeypatch.setenv("CTX_NATS_URL", "nats://nats:4222")
    assert load_settings().bus.nats_url == ("nats://nats:4222",)
    assert Settings(nats_url=CLUSTER).bus.nats_url == tuple(CLUSTER.split(","))
    assert Settings(nats_url=["nats://a:1", "nats://b:2"]).bus.nats_url == ("nats://a:1", "nats://b:2")
    monkeypatch.delenv("CTX_NATS_URL")
    assert Settings().bus.nats_url is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("nats://a:4222,,nats://b:4222", "URL 2 of 3 is empty"),
        ("nats://a:4222,", "URL 2 of 2 is empty"),
        (",nats://a:4222", "URL 1 of 2 is empty"),
        (" , ", "name at least one nats:// URL"),
        ("", "name at least one nats:// URL"),
        ("nats://a:4222,http://b:4222", "must be nats://, tls://, ws:// or wss:// URLs, got 'http://b:4222'"),
        ("nats://a:4222,nats://:4222", "names no host"),
        ("nats://a:4222,nats://b:99999", "is not a URL (bad port?)"),
        ("nats://a:4222,ws://b:8080", "cannot be mixed"),
    ],
)
def test_nats_url_with_an_empty_or_malformed_part_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.setenv("CTX_NATS_URL", value)
    with pytest.raises(InvalidConfiguration) as caught:
        load_settings()
    [problem] = caught.value.problems
    assert problem.startswith("CTX_NATS_URL: ") and says in problem


def test_credentials_in_one_url_are_used_for_every_server_and_leave_the_urls() -> None:
    urls, options = nats_connection("nats://fleet:s%40cret@a:4222, nats://b:4222,nats://c:4222", {})
    # nats-py would send a URL's credentials to that server only, not to the others nor to the
    # servers it discovers; FastStream refuses URL credentials beside its security object.
    assert urls == ["nats://a:4222", "nats://b:4222", "nats://c:4222"]
    assert options == {"user": "fleet", "password": "s@cret"}
    urls, options = nats_connection(("nats://a:4222", "nats://t0ken@b:4222"), {"name": "x"})
    assert (urls, options) == (["nats://a:4222", "nats://b:4222"], {"name": "x", "token": "t0ken"})
    # The same credentials written in every URL are one identity, not a conflict.
    same = "nats://fleet:pw@a:4222,nats://fleet:pw@b:4222"
    assert nats_connection(same, {})[1] == {"user": "fleet", "password": "pw"}


def test_credentials_given_as_settings_win_over_none_in_the_urls() -> None:
    urls, options = nats_connection(CLUSTER, {"user": "recorder", "password": "pw"})
    assert (urls, options) == (CLUSTER.split(","), {"user": "recorder", "password": "pw"})


def test_urls_naming_different_credentials_are_refused_without_echoing_a_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTX_NATS_URL", "nats://fleet:first-secret@a:4222,nats://fleet:second-secret@b:4222")
    with pytest.raises(InvalidConfiguration, match="the URLs carry different credentials") as caught:
        load_settings()
    assert "first-secret" not in caught.value.message and "second-secret" not in caught.value.message
    monkeypatch.setenv("CTX_NATS_URL", "nats://fleet:hunter2@a:4222,http://b:4222")
    with pytest.raises(InvalidConfiguration) as caught:
        load_settings()
    assert "hunter2" not in caught.value.message


def test_credentials_in_the_urls_and_a_nats_user_are_two_methods_refused_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CTX_NATS_URL", "nats://a:4222,nats://fleet:pw@b:4222")
    monkeypatch.setenv("CTX_NATS_USER", "recorder")
    monkeypatch.setenv("CTX_NATS_PASSWORD", "pw2")
    with pytest.raises(
        InvalidConfiguration, match=re.escape("not CTX_NATS_USER and credentials in CTX_NATS_URL")
    ):
        load_settings()


def test_the_workers_broker_gets_every_url_and_the_urls_credentials() -> None:
    settings = Settings(nats_url="nats://fleet:pw@127.0.0.1:14301," + CLUSTER.split(",", 1)[1])
    assert settings.bus.nats_url is not None
    connection = create_broker(settings, settings.bus.nats_url)._connection_kwargs
    assert connection["servers"] == CLUSTER.split(",")
    assert (connection["user"], connection["password"]) == ("fleet", "pw")


@pytest.mark.anyio
async def test_the_client_refuses_malformed_urls_before_connecting() -> None:
    with pytest.raises(InvalidConfiguration, match="URL 2 of 3 is empty"):
        await FleetClient.connect("nats://127.0.0.1:1,,nats://127.0.0.1:2")
    assert parse_nats_urls(["nats://a:1, nats://b:2", "nats://c:3"]) == (
        "nats://a:1",
        "nats://b:2",
        "nats://c:3",
    )


@pytest.fixture
def external_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A shell where CTX_NATS_URL names an external cluster, with no fleet in the data folder."""
    monkeypatch.setenv("CTX_NATS_URL", CLUSTER.replace(",", " , "))
    monkeypatch.setenv("CTX_DATA_DIR", str(tmp_path))
    for name in ("CTX_NATS_USER", "CTX_NATS_PASSWORD", "CTX_TENANT"):
        monkeypatch.delenv(name, raising=False)


def test_ctxfleet_env_prints_every_url_of_the_configured_cluster(
    external_cluster: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["env"]) == 0
    assert capsys.readouterr().out == f"CTX_NATS_URL={CLUSTER}\nCTX_TENANT=default\n"


def test_ctxfleet_env_prints_the_configured_identity_again_in_a_shell_that_has_it(
    external_cluster: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CTX_NATS_USER", "runtime-acme")
    monkeypatch.setenv("CTX_NATS_PASSWORD", "pa ss")
    monkeypatch.setenv("CTX_TENANT", "acme")
    assert main(["env"]) == 0
    assert capsys.readouterr().out == (
        f"CTX_NATS_URL={CLUSTER}\nCTX_NATS_USER=runtime-acme\nCTX_NATS_PASSWORD='pa ss'\nCTX_TENANT=acme\n"
    )


@pytest.mark.parametrize("argv", [["env", "--tenant", "acme"], ["--tenant", "acme", "env"]])
def test_ctxfleet_env_takes_the_tenant_after_the_command_as_before_it(
    argv: list[str], external_cluster: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "CTX_TENANT=acme"


def test_the_asyncapi_document_names_every_server_of_the_cluster_without_credentials() -> None:
    doc = asyncapi_document(Settings(nats_url="nats://ops:secret@n1.internal:4333," + CLUSTER))
    hosts = {name: server["host"] for name, server in doc["servers"].items()}
    assert hosts == {
        "fleet": "n1.internal:4333",
        "fleet-2": "127.0.0.1:14301",
        "fleet-3": "127.0.0.1:14302",
        "fleet-4": "127.0.0.1:14303",
    }
    assert "secret" not in str(doc["servers"]) and "ops" not in str(doc["servers"])
    assert asyncapi_document(Settings())["servers"]["fleet"]["host"] == "localhost:4250"
