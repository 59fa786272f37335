"""The container image and the Compose stack, checked by reading the files (no Docker engine here).

Each check is one promise the deployment makes: the image runs ``ctxfleet`` as a non-root user on the
port Prometheus scrapes, Compose starts every worker after migrations and provisioning with its own
NATS user, every CTX_* variable is one Settings reads, and no password is written into a file.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from services import settings as settings_module
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
INFRA = ROOT / "infra"
CONTAINERFILE = ROOT / "Containerfile"
COMPOSE = INFRA / "compose.yaml"
COMPOSE_ENV_EXAMPLE = INFRA / "compose.env.example"
PROMETHEUS = INFRA / "prometheus" / "prometheus.yml"
GRAFANA = INFRA / "grafana"
NATS_AUTH = INFRA / "nats" / "auth.conf"

WORKERS = ("recorder", "assembler", "budgeter", "compactor", "indexer")
HTTP_PORT = 9464
_SECRETISH = re.compile(r"PASSWORD|TOKEN|SECRET|API_KEY|CREDENTIAL|PRIVATE_KEY|NKEY_SEED", re.I)
_INTERPOLATION = re.compile(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}")
_CTX_NAME = re.compile(r"\bCTX_[A-Z0-9_]*[A-Z0-9]\b")


def accepted_env_names() -> frozenset[str]:
    return Settings.env_names()


# --- Containerfile ---------------------------------------------------------------------------------


def containerfile_stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage as (KEYWORD, arguments); line continuations joined, comments dropped.

    Stage 0 holds the ARGs declared before the first FROM.
    """
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in CONTAINERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    stages: list[list[tuple[str, str]]] = [[]]
    for keyword, rest in instructions:
        if keyword == "FROM":
            stages.append([])
        stages[-1].append((keyword, rest))
    return stages


def env_pairs(arguments: str) -> dict[str, str]:
    """``ENV A=1 B="x y"`` (or the legacy ``ENV A 1``) → {A: 1, B: x y}."""
    words = shlex.split(arguments)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(word.split("=", 1) for word in words)


def final_stage() -> list[tuple[str, str]]:
    return containerfile_stages()[-1]


def instruction_values(stage: list[tuple[str, str]], keyword: str) -> list[str]:
    return [rest for kw, rest in stage if kw == keyword]


def image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for arguments in instruction_values(final_stage(), "ENV"):
        env.update(env_pairs(arguments))
    return env


def test_image_is_built_on_python_311_slim() -> None:
    defaults = {}
    for arguments in instruction_values(containerfile_stages()[0], "ARG"):
        name, _, value = arguments.partition("=")
        defaults[name] = value
    for stage in containerfile_stages()[1:]:
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults[m.group(1) or m.group(2)], image)
        assert image.startswith("python:3.11-slim"), image


def test_image_installs_the_package_itself_not_editable_and_without_dev_extras() -> None:
    runs = " ".join(rest for stage in containerfile_stages() for rest in instruction_values(stage, "RUN"))
    assert re.search(r"pip install\s+(?:\S+\s+)*\.(?:\s|$)", runs), "the image must `pip install .`"
    assert not re.search(r"(?:^|\s)(?:-e|--editable)(?:\s|$)", runs)
    assert "[dev" not in CONTAINERFILE.read_text(encoding="utf-8")


def test_the_wheel_the_image_installs_carries_every_file_the_workers_read(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys
    import zipfile

    # Build from a copy: an in-tree build leaves build/ behind, and the image builds from a clean context.
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", ".ctxfleet", "build", "*.egg-info", "__pycache__", "out"
        ),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    [wheel] = (tmp_path / "dist").glob("ctxfleet-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    needed = [
        *(f"infra/migrations/{p.name}" for p in (ROOT / "infra" / "migrations").glob("*.sql")),
        *(
            f"services/tokenizer_data/{p.name}"
            for p in (ROOT / "services" / "tokenizer_data").glob("*.tiktoken.gz")
        ),
        *(f"infra/samples/{p.name}" for p in (ROOT / "infra" / "samples").glob("*.jsonl")),
        "contracts/py.typed",
        "ctxfleet_client/py.typed",
        "services/py.typed",
        "workers/py.typed",
        "infra/nats_accounts.py",
        "workers/health.py",
    ]
    assert len(needed) > 10 and sorted(set(needed) - names) == []
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names), "test or bench code in the image"
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "ctxfleet = infra.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_final_stage_runs_as_a_numeric_non_root_user() -> None:
    # A numeric uid lets Kubernetes' runAsNonRoot verify the user without reading /etc/passwd.
    users = instruction_values(final_stage(), "USER")
    assert users, "the final stage must switch to a non-root USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert int(uid) == 10001


def test_entrypoint_is_ctxfleet_and_the_default_command_runs_the_recorder() -> None:
    assert json.loads(instruction_values(final_stage(), "ENTRYPOINT")[-1]) == ["ctxfleet"]
    assert json.loads(instruction_values(final_stage(), "CMD")[-1]) == ["worker", "recorder"]


def test_image_serves_http_on_all_interfaces_of_the_exposed_port() -> None:
    exposed = {int(p.split("/")[0]) for e in instruction_values(final_stage(), "EXPOSE") for p in e.split()}
    assert HTTP_PORT in exposed
    env = image_env()
    assert env["CTX_HTTP_PORT"] == str(HTTP_PORT)
    assert env["CTX_HTTP_HOST"] == "0.0.0.0"
    assert env["CTX_DATA_DIR"].startswith("/tmp/")


def test_image_healthcheck_uses_python_against_healthz() -> None:
    # The slim base has neither curl nor wget.
    (check,) = instruction_values(final_stage(), "HEALTHCHECK")
    command = json.loads(check[check.index("CMD") + 3 :].strip())
    assert command[0] == "python"
    assert f"http://127.0.0.1:{HTTP_PORT}/healthz" in command[-1]


def test_image_env_and_build_args_hold_no_secrets_and_only_known_settings() -> None:
    # ENV and ARG values end up in the image's history and config, readable by anyone who pulls it.
    for stage in containerfile_stages():
        env = {k: v for a in instruction_values(stage, "ENV") for k, v in env_pairs(a).items()}
        env |= dict(a.partition("=")[::2] for a in instruction_values(stage, "ARG"))
        assert not [n for n in env if _SECRETISH.search(n)], sorted(env)
        assert not [v for v in env.values() if "://" in v and urlsplit(v).password], "a URL with a password"
        assert {n for n in env if n.startswith("CTX_")} <= accepted_env_names()


def test_ignore_files_keep_secrets_and_local_state_out_of_the_build_but_not_the_sources() -> None:
    docker, container = ROOT / ".dockerignore", ROOT / ".containerignore"
    assert docker.read_text(encoding="utf-8") == container.read_text(encoding="utf-8")
    patterns = [
        line.strip()
        for line in docker.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith("!")
    ]
    assert {".git", ".venv", "infra/compose.env", "infra/secrets"} <= set(patterns)
    sources = [
        word.rstrip("/")
        for stage in containerfile_stages()
        for copy in instruction_values(stage, "COPY")
        if not copy.startswith("--from")
        for word in copy.split()[:-1]
    ]
    assert "pyproject.toml" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        ignored = [p for p in patterns if PurePosixPath(source).match(p) or source == p.rstrip("/")]
        assert not ignored, f"{source} is copied but ignored by {ignored}"


# --- Compose ---------------------------------------------------------------------------------------


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return data


def services() -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"]
    return found


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: "" if value is None else str(value) for key, value in env.items()}


def granted(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The secrets a service may read, by name, in long syntax (``- name`` is ``{source: name}``)."""
    grants = [{"source": g} if isinstance(g, str) else g for g in service.get("secrets", [])]
    return {g["source"]: g for g in grants}


def example_env() -> dict[str, str]:
    pairs = {}
    for line in COMPOSE_ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def interpolate(value: str) -> str:
    """What Compose makes of ``${VAR:-default}`` with none of the optional variables set."""
    return _INTERPOLATION.sub(lambda m: m.group(3) if (m.group(2) or "").endswith("-") else "", value)


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path → source (a path relative to infra/ for binds, or a volume name)."""
    found = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        found[target] = source
    return found


def host_path(service: dict[str, Any], container_path: str) -> Path | None:
    """Where a file the container reads at ``container_path`` comes from in this repository."""
    for target, source in mounts(service).items():
        if source.startswith((".", "/")) and (
            container_path == target or container_path.startswith(target + "/")
        ):
            return (INFRA / source / container_path[len(target) :].lstrip("/")).resolve()
    return None


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration))


def image_version(image: str) -> tuple[int, ...]:
    tag = image.partition(":")[2]
    match = re.match(r"v?(\d+(?:\.\d+)*)", tag)
    assert match, f"{image} is not pinned to a version"
    return tuple(int(x) for x in match.group(1).split("."))


def test_compose_runs_each_worker_from_the_repository_image() -> None:
    svc = services()
    for name in WORKERS:
        worker = svc[name]
        assert worker["command"] == ["worker", name]
        assert (INFRA / worker["build"]["context"]).resolve() == ROOT
        assert worker["build"]["dockerfile"] == "Containerfile"
    assert len({svc[name]["image"] for name in (*WORKERS, "migrate", "provision")}) == 1


def test_workers_start_after_migrations_and_stream_provisioning_completed() -> None:
    svc = services()
    assert svc["migrate"]["command"] == ["migrate"]
    assert svc["provision"]["command"] == ["provision"]
    assert svc["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert svc["provision"]["depends_on"]["nats"]["condition"] == "service_healthy"
    assert svc["provision"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in WORKERS:
        assert svc[name]["depends_on"]["provision"]["condition"] == "service_completed_successfully", name


@pytest.mark.parametrize("name", [*WORKERS, "provisioner"])
def test_each_fleet_process_connects_to_nats_as_its_own_user(name: str) -> None:
    svc = services()
    service = svc["provision" if name == "provisioner" else name]
    env = environment(service)
    assert env["CTX_NATS_USER"] == name
    assert env["CTX_NATS_PASSWORD_FILE"] == f"/run/secrets/nats_{name}"
    assert f"nats_{name}" in granted(service)
    assert f"nats_{name}" in compose()["secrets"]
    assert "CTX_NATS_PASSWORD" not in env


@pytest.mark.parametrize("name", [*WORKERS, "migrate"])
def test_database_password_comes_from_the_secret_file_not_the_url(name: str) -> None:
    service = services()[name]
    env = environment(service)
    assert urlsplit(env["CTX_DATABASE_URL"]).password is None
    assert env["CTX_DATABASE_PASSWORD_FILE"] == "/run/secrets/db_password"
    assert "db_password" in granted(service)


def test_worker_healthchecks_probe_readiness() -> None:
    for name in WORKERS:
        check = " ".join(services()[name]["healthcheck"]["test"])
        assert f"127.0.0.1:{HTTP_PORT}/readyz" in check, name


def test_workers_get_more_time_to_stop_than_their_drain_timeout() -> None:
    for name in WORKERS:
        service = services()[name]
        drain = float(interpolate(environment(service).get("CTX_SHUTDOWN_TIMEOUT_S", "25")))
        assert seconds(service["stop_grace_period"]) > drain, name


def test_nats_is_at_least_2_10_with_jetstream_and_the_fleet_config() -> None:
    nats = services()["nats"]
    assert nats["image"].startswith("nats:")
    assert (2, 10) <= image_version(nats["image"])[:2] < (3, 0)
    command = nats["command"]
    assert "-js" in command
    assert command[command.index("-c") + 1] == "/etc/nats/nats.conf"
    assert host_path(nats, "/etc/nats/nats.conf") == INFRA / "nats" / "nats.conf"


def test_postgres_prometheus_and_grafana_are_in_the_stack() -> None:
    svc = services()
    assert svc["postgres"]["image"].startswith("postgres:")
    assert image_version(svc["postgres"]["image"])[0] >= 16
    assert environment(svc["postgres"])["POSTGRES_PASSWORD_FILE"] == "/run/secrets/db_password"
    assert svc["prometheus"]["image"].startswith("prom/prometheus:")
    assert svc["grafana"]["image"].startswith("grafana/grafana:")


def test_third_party_images_are_pinned_to_a_version() -> None:
    third_party = {name: s["image"] for name, s in services().items() if "build" not in s}
    assert {"nats", "postgres", "prometheus", "grafana"} <= third_party.keys()
    for name, image in third_party.items():
        assert image_version(image), f"{name}: {image} is not pinned to a version"


def test_published_ports_listen_on_localhost_only() -> None:
    for name, service in services().items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_every_ctx_variable_in_the_deployment_files_is_one_settings_accepts() -> None:
    accepted = accepted_env_names()
    for path in (COMPOSE, COMPOSE_ENV_EXAMPLE, CONTAINERFILE):
        unknown = set(_CTX_NAME.findall(path.read_text(encoding="utf-8"))) - accepted
        assert not unknown, f"{path.relative_to(ROOT)}: Settings does not read {sorted(unknown)}"


@pytest.mark.parametrize("name", [*WORKERS, "migrate", "provision"])
def test_settings_accept_the_environment_compose_gives(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Secret files stand in for /run/secrets/*; everything else is what the container would see.
    for key in list(os.environ):
        if key.startswith("CTX_"):
            monkeypatch.delenv(key)
    env = {**image_env(), **environment(services()[name])}
    for key, value in env.items():
        if not key.startswith("CTX_"):
            continue
        value = interpolate(value)
        if key.endswith("_FILE") and value.startswith("/run/secrets/"):
            secret = tmp_path / PurePosixPath(value).name
            secret.write_text("not-a-real-secret\n", encoding="utf-8")
            value = str(secret)
        monkeypatch.setenv(key, value)
    load = getattr(settings_module, "load_settings", Settings)
    settings = load()
    if name in WORKERS:
        assert settings.bus.nats_url and settings.store.database_url


def test_no_secret_value_is_written_into_the_compose_file() -> None:
    for name, service in services().items():
        for key, value in environment(service).items():
            assert "://" not in value or urlsplit(value).password is None, (
                f"{name}.{key} has a password in a URL"
            )
            if not _SECRETISH.search(key):
                continue
            if key.endswith("_FILE"):
                assert value.startswith("/run/secrets/"), f"{name}.{key}"
                assert value.rsplit("/", 1)[1] in granted(service), f"{name}.{key}: secret not granted"
            else:
                # Only the NATS server takes passwords as variables (auth.conf needs them), and then
                # only as a reference to infra/compose.env.
                assert _INTERPOLATION.fullmatch(value), f"{name}.{key} is written inline"
    for name, secret in compose()["secrets"].items():
        assert set(secret) <= {"environment", "file", "external", "name"}, name


@pytest.mark.parametrize("name", [*WORKERS, "migrate", "provision", "grafana"])
def test_secret_files_are_readable_by_a_non_root_container(name: str) -> None:
    # Some Compose versions write environment-sourced secrets root-only (0400) unless told otherwise,
    # and these containers do not run as root.
    for secret, grant in granted(services()[name]).items():
        readable = grant.get("mode", 0) & 0o004 or grant.get("uid") == "10001"
        assert readable, f"{name} cannot read /run/secrets/{secret}: give it mode 0444 or its uid"


def test_secrets_and_required_variables_are_listed_empty_in_the_env_example() -> None:
    example = example_env()
    text = COMPOSE.read_text(encoding="utf-8")
    required = {m.group(1) for m in _INTERPOLATION.finditer(text) if m.group(2) in (None, "?", ":?")}
    required |= {s["environment"] for s in compose()["secrets"].values() if "environment" in s}
    assert required <= example.keys(), (
        f"missing from compose.env.example: {sorted(required - example.keys())}"
    )
    # The example must not ship a password someone could deploy unchanged.
    assert not {k: v for k, v in example.items() if _SECRETISH.search(k) and v}


def test_every_nats_user_the_fleet_uses_exists_in_the_auth_config() -> None:
    auth = NATS_AUTH.read_text(encoding="utf-8")
    users = set(re.findall(r"\buser\s*[:=]\s*[\"']?([\w.-]+)", auth))
    fleet = {
        environment(s)["CTX_NATS_USER"] for s in services().values() if "CTX_NATS_USER" in environment(s)
    }
    assert fleet <= users, f"users missing from auth.conf: {sorted(fleet - users)}"


def test_the_compose_nats_users_are_rendered_from_the_accounts_table() -> None:
    from infra.nats_accounts import render_auth_conf

    assert (INFRA / "nats" / "auth.conf").read_text(encoding="utf-8") == render_auth_conf(), (
        "infra/nats/auth.conf is stale: python -m infra.nats_accounts > infra/nats/auth.conf"
    )


def test_the_nats_server_receives_every_variable_its_config_refers_to() -> None:
    confs = sorted((INFRA / "nats").glob("*.conf"))

    # A NATS conf variable is a bare $NAME; inside quotes ("$JS.API.>") and comments it is a subject or prose.
    def bare(text: str) -> str:
        text = re.sub(r"#.*", "", text)
        return re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)

    referenced = {
        v for c in confs for v in re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", bare(c.read_text(encoding="utf-8")))
    }
    assert referenced, "auth.conf refers to no password variable: the test would prove nothing"
    given = environment(services()["nats"]).keys()
    assert referenced <= given, f"the nats service lacks {sorted(referenced - given)}"


# --- Prometheus and Grafana ------------------------------------------------------------------------


def prometheus_config() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    return data


def test_prometheus_scrapes_every_worker_on_the_http_port() -> None:
    scraped: set[tuple[str, int]] = set()
    for job in prometheus_config()["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            scraped |= {(host, int(sd["port"])) for host in sd["names"]}
        for static in job.get("static_configs", []):
            scraped |= {(t.rsplit(":", 1)[0], int(t.rsplit(":", 1)[1])) for t in static["targets"]}
    assert {(name, HTTP_PORT) for name in WORKERS} <= scraped


def test_prometheus_config_and_alert_rules_are_the_files_compose_mounts() -> None:
    prometheus = services()["prometheus"]
    flags = dict(f.split("=", 1) for f in prometheus["command"] if "=" in f)
    assert host_path(prometheus, flags["--config.file"]) == PROMETHEUS
    rule_files = [host_path(prometheus, path) for path in prometheus_config()["rule_files"]]
    assert INFRA / "prometheus" / "alerts.yaml" in rule_files
    assert all(path is not None and path.is_file() for path in rule_files)


def test_grafana_provisions_the_prometheus_datasource_and_the_dashboards_folder() -> None:
    grafana = services()["grafana"]
    assert host_path(grafana, "/etc/grafana/provisioning") == GRAFANA / "provisioning"
    (datasources,) = (GRAFANA / "provisioning" / "datasources").glob("*.yaml")
    (source,) = yaml.safe_load(datasources.read_text(encoding="utf-8"))["datasources"]
    assert source["type"] == "prometheus"
    assert urlsplit(source["url"]).hostname in services()
    # $__rate_interval is only right when Grafana knows the scrape interval.
    assert source["jsonData"]["timeInterval"] == prometheus_config()["global"]["scrape_interval"]
    (providers,) = (GRAFANA / "provisioning" / "dashboards").glob("*.yaml")
    for provider in yaml.safe_load(providers.read_text(encoding="utf-8"))["providers"]:
        assert host_path(grafana, provider["options"]["path"]) == GRAFANA / "dashboards"
    home = environment(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert host_path(grafana, home) == GRAFANA / "dashboards" / "ctxfleet.json"
