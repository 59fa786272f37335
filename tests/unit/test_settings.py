"""Settings: typed, read from CTX_* and *_FILE, refused clearly when wrong, secrets never echoed."""

from __future__ import annotations

import re
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.exceptions import InvalidConfiguration
from services.settings import GROUP_OF, SECRET_FIELDS, Settings, load_settings, parse_partitions, redact_url

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("CTX_"):
            monkeypatch.delenv(name)


def test_every_problem_is_named_by_its_variable_in_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_PARTITIONS", "0")
    monkeypatch.setenv("CTX_HTTP_PORT", "http")
    monkeypatch.setenv("CTX_SUMMARIZER", "magic")
    with pytest.raises(InvalidConfiguration) as caught:
        load_settings()
    problems = "\n".join(caught.value.problems)
    assert "CTX_PARTITIONS: Input should be greater than or equal to 1" in problems
    assert "CTX_HTTP_PORT:" in problems and "CTX_SUMMARIZER:" in problems
    assert caught.value.code.value == "invalid_configuration"


def test_a_rejected_secret_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_DATABASE_URL", "mysql://app:hunter2-secret@db/ctx")
    monkeypatch.setenv("CTX_NATS_USER", "recorder")
    with pytest.raises(InvalidConfiguration) as caught:
        load_settings()
    assert "hunter2-secret" not in caught.value.message
    assert "CTX_DATABASE_URL" in caught.value.message or "CTX_NATS_PASSWORD" in caught.value.message


def test_secrets_are_hidden_from_repr_and_redacted_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_DATABASE_URL", "postgresql://app:hunter2@db:5432/ctx")
    monkeypatch.setenv("CTX_NATS_USER", "recorder")
    monkeypatch.setenv("CTX_NATS_PASSWORD", "s3cret-nats")
    monkeypatch.setenv("CTX_SUMMARIZER_API_KEY", "sk-abcdef")
    s = load_settings()
    shown = repr(s) + str(s) + s.model_dump_json()
    for secret in ("hunter2", "s3cret-nats", "sk-abcdef"):
        assert secret not in shown
    assert redact_url(s.store.database_dsn) == "postgresql://app:***@db:5432/ctx"
    assert s.bus.nats_options() == {"user": "recorder", "password": "s3cret-nats"}


def test_secrets_are_read_from_files_without_the_trailing_newline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "db").write_text("pg-pass\n")
    (tmp_path / "nats").write_text("nats-pass")
    monkeypatch.setenv("CTX_DATABASE_PASSWORD_FILE", str(tmp_path / "db"))
    monkeypatch.setenv("CTX_NATS_USER", "compactor")
    monkeypatch.setenv("CTX_NATS_PASSWORD_FILE", str(tmp_path / "nats"))
    s = load_settings()
    assert s.store.database_options() == {"password": "pg-pass"}
    assert s.bus.nats_options()["password"] == "nats-pass"


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ({"CTX_NATS_TOKEN_FILE": "{missing}"}, "CTX_NATS_TOKEN_FILE: cannot read"),
        ({"CTX_NATS_TOKEN_FILE": "{empty}"}, "is empty"),
        ({"CTX_NATS_TOKEN_FILE": "{empty}", "CTX_NATS_TOKEN": "x"}, "not both"),
    ],
)
def test_a_bad_secret_file_is_a_clear_startup_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setup: dict[str, str], expected: str
) -> None:
    (tmp_path / "empty").write_text("\n")
    for name, value in setup.items():
        monkeypatch.setenv(name, value.format(missing=tmp_path / "nope", empty=tmp_path / "empty"))
    with pytest.raises(InvalidConfiguration, match=expected):
        load_settings()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"CTX_NATS_USER": "a", "CTX_NATS_PASSWORD": "b", "CTX_NATS_TOKEN": "t"},
            "choose one NATS authentication method",
        ),
        ({"CTX_NATS_USER": "a"}, "CTX_NATS_USER and CTX_NATS_PASSWORD go together"),
        ({"CTX_NATS_CREDS_FILE": "/nonexistent/x.creds"}, "CTX_NATS_CREDS_FILE"),
        ({"CTX_NATS_URL": "http://localhost:4222"}, "CTX_NATS_URL: must be nats://"),
        ({"CTX_RECORDER_PARTITIONS": "pod/4", "CTX_POD_NAME": "recorder"}, "ending in -<ordinal>"),
        ({"CTX_RECORDER_PARTITIONS": "pod/2", "CTX_POD_NAME": "recorder-2"}, "replica 2 of 2 does not exist"),
        ({"CTX_WORKERS": "recorder,telepath"}, "telepath"),
        ({"CTX_SUMMARIZER": "openai"}, "CTX_SUMMARIZER_BASE_URL"),
        ({"CTX_SHUTDOWN_TIMEOUT_S": "0"}, "CTX_SHUTDOWN_TIMEOUT_S"),
        ({"CTX_LOG_LEVEL": "chatty"}, "CTX_LOG_LEVEL"),
    ],
)
def test_contradictory_or_malformed_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidConfiguration, match=re.escape(expected)):
        load_settings()


def test_a_statefulset_pod_owns_the_partitions_of_its_ordinal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTX_PARTITIONS", "16")
    monkeypatch.setenv("CTX_RECORDER_PARTITIONS", "pod/4")
    owned = []
    for ordinal in range(4):
        monkeypatch.setenv("CTX_POD_NAME", f"ctxfleet-recorder-{ordinal}")
        owned.append(load_settings().owned_partitions())
    assert owned[1] == (1, 5, 9, 13)
    assert sorted(p for o in owned for p in o) == list(range(16))
    assert parse_partitions("pod/3", 6, pod_name="r-0") == (0, 3)


def test_tls_and_nkey_options_reach_the_nats_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seed = tmp_path / "user.nk"
    seed.write_text("SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBU\n")
    monkeypatch.setenv("CTX_NATS_NKEY_SEED_FILE", str(seed))
    monkeypatch.setenv("CTX_NATS_URL", "tls://nats.example:4222")
    ca = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")
    if ca.exists():
        monkeypatch.setenv("CTX_NATS_TLS_CA_FILE", str(ca))
    options = load_settings().bus.nats_options()
    assert options["nkeys_seed"] == str(seed)
    if ca.exists():
        assert isinstance(options["tls"], ssl.SSLContext)


def test_env_names_cover_every_field_and_the_file_variants_of_secrets() -> None:
    names = Settings.env_names()
    assert {f"CTX_{f.upper()}" for f in GROUP_OF} <= names
    assert {f"CTX_{f.upper()}_FILE" for f in SECRET_FIELDS} <= names
    assert "CTX_NATS_PASSWORD_FILE" in names and "CTX_PARTITIONS_FILE" not in names


def test_the_configuration_doc_documents_every_setting_with_its_default() -> None:
    table = CONFIGURATION.read_text().split("## Every setting", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`(CTX_[A-Z_]+)`", table))
    missing = sorted(Settings.env_names() - documented)
    assert missing == [], f"docs/configuration.md '## Every setting' lacks {missing}"
    assert sorted(documented - Settings.env_names()) == []


def test_the_cli_refuses_to_start_on_bad_configuration_with_exit_code_2(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "CTX_PARTITIONS": "-3",
        "CTX_DATABASE_PASSWORD": "pw-not-shown",
        "CTX_DATABASE_URL": "x",
    }
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", "worker", "recorder"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        "bad configuration" in result.stderr
        and "CTX_PARTITIONS" in result.stderr
        and "CTX_DATABASE_URL" in result.stderr
    )
    assert "pw-not-shown" not in result.stderr and "Traceback" not in result.stderr


def test_tenants_are_read_once_each_in_order_and_a_name_that_cannot_be_a_subject_token_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().bus.tenant_names == ("default",)
    monkeypatch.setenv("CTX_TENANTS", " default, acme,acme ,globex-2")
    assert load_settings().bus.tenant_names == ("default", "acme", "globex-2")
    for bad in ("acme.eu", "acme,*", " , "):
        monkeypatch.setenv("CTX_TENANTS", bad)
        with pytest.raises(InvalidConfiguration, match="CTX_TENANTS"):
            load_settings()
    monkeypatch.setenv("CTX_TENANTS", "default")
    monkeypatch.setenv("CTX_TENANT", "a>b")
    with pytest.raises(InvalidConfiguration, match="CTX_TENANT"):
        load_settings()
