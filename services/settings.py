"""The fleet's configuration: one typed object, read from ``CTX_*`` environment variables.

The settings come in groups (``settings.bus``, ``.store``, ``.embedded``, ``.process``, ``.limits``,
``.tuning``, ``.compaction``), each a frozen model; a setting's variable is ``CTX_<NAME>`` whatever
its group, so names are unique across groups. Hot-path constants no operator should turn live in
the modules that use them, each with its reason.

Secrets (database password or URL, NATS password or token, summarizer API key) come from the
environment or, with the ``_FILE`` suffix, from a file (a mounted Kubernetes or Compose secret).
They are ``SecretStr`` or hidden from ``repr``, and a bad value is reported by name, never echoed.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from contracts.subjects import DEFAULT_TENANT, check_tenant

from ctxfleet_client.connection import nats_connection, parse_nats_urls, redact_url, url_credentials

from contracts.exceptions import InvalidConfiguration

__all__ = [
    "ENV_PREFIX",
    "GROUPS",
    "GROUP_OF",
    "SECRET_FIELDS",
    "WORKER_NAMES",
    "BusSettings",
    "CompactionSettings",
    "EmbeddedSettings",
    "LimitsSettings",
    "ProcessSettings",
    "Settings",
    "StoreSettings",
    "TuningSettings",
    "default_data_dir",
    "load_settings",
    "nats_connection",
    "parse_nats_urls",
    "parse_partitions",
    "parse_tenants",
    "redact_url",
]

ENV_PREFIX = "CTX_"
# The settings that may hold a credential: never echoed, readable from ``CTX_<NAME>_FILE``.
SECRET_FIELDS = ("nats_password", "nats_token", "database_url", "database_password", "summarizer_api_key")
WORKER_NAMES = ("recorder", "assembler", "budgeter", "compactor", "indexer")
_ORDINAL = re.compile(r"-(\d+)$")


def default_data_dir() -> Path:
    """``.ctxfleet`` in the checkout whose ``.venv`` runs us, else in the current directory.

    So ``.venv/bin/ctxfleet`` finds the fleet that ``make run`` started, from any terminal.
    """
    prefix = Path(sys.prefix)
    if prefix.name == ".venv":
        return prefix.parent / ".ctxfleet"
    return Path.cwd() / ".ctxfleet"


def parse_partitions(spec: str, partitions: int, *, pod_name: str | None = None) -> tuple[int, ...]:
    """``"all"``, ``"3"``, ``"0-7"``, ``"0-3,8,12-15"``, ``"i/k"`` (replica i of k) or ``"pod/k"``.

    ``pod/k`` is ``i/k`` with ``i`` the ordinal of a StatefulSet pod (``recorder-2`` → 2), so one
    manifest serves every replica.
    """
    spec = spec.strip()
    if spec == "all":
        return tuple(range(partitions))
    if "/" in spec:
        index_text, count_text = spec.split("/", 1)
        count = int(count_text)
        if index_text == "pod":
            match = _ORDINAL.search(pod_name or "")
            if match is None:
                raise ValueError(f"'pod/{count}' needs CTX_POD_NAME ending in -<ordinal>; it is {pod_name!r}")
            index = int(match.group(1))
        else:
            index = int(index_text)
        if not 0 <= index < count:
            raise ValueError(f"replica {index} of {count} does not exist")
        return tuple(p for p in range(partitions) if p % count == index)
    chosen: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        chosen.extend(range(int(lo), int(hi or lo) + 1))
    bad = [p for p in chosen if not 0 <= p < partitions]
    if bad:
        raise ValueError(f"partitions {bad} are outside 0..{partitions - 1}")
    return tuple(sorted(set(chosen)))


def parse_tenants(spec: str) -> tuple[str, ...]:
    """``"default,acme"`` → ``("default", "acme")``;
    raises ``ValueError`` for a name that cannot be a tenant."""
    tenants = tuple(dict.fromkeys(check_tenant(t.strip()) for t in spec.split(",") if t.strip()))
    if not tenants:
        raise ValueError("name at least one tenant")
    return tenants


class _Source(PydanticBaseSettingsSource):
    """A source that reads every value at once (``__call__``), not field by field."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False


class _FlatEnv(_Source):
    """``CTX_<NAME>`` for every setting of every group, as the flat ``{name: text}`` the groups take."""

    def __call__(self) -> dict[str, Any]:
        # Case-insensitive, as pydantic-settings reads variables.
        env = {key.upper(): value for key, value in os.environ.items()}
        return {name: env[var] for name in GROUP_OF if (var := f"{ENV_PREFIX}{name.upper()}") in env}


class _SecretFiles(_Source):
    """``CTX_<SECRET>_FILE=/path``: the secret is the file's content (one trailing newline dropped)."""

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        problems: list[str] = []
        for name in SECRET_FIELDS:
            var = f"{ENV_PREFIX}{name.upper()}"
            path = os.environ.get(f"{var}_FILE")
            if not path:
                continue
            if os.environ.get(var):
                problems.append(f"{var}_FILE: set either {var} or {var}_FILE, not both")
                continue
            try:
                text = Path(path).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                problems.append(f"{var}_FILE: cannot read {path}: {getattr(exc, 'strerror', None) or exc}")
                continue
            value = text[:-1] if text.endswith("\n") else text
            if not value.strip():
                problems.append(f"{var}_FILE: {path} is empty")
                continue
            values[name] = value.rstrip("\r")
        if problems:
            raise InvalidConfiguration(problems)
        return values


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BusSettings(_Group):
    """NATS: where the servers are, how to authenticate, and the shape of the streams."""

    # Unset: the embedded server under ``data_dir``. CTX_NATS_URL names one server or a cluster's,
    # comma-separated; it is read once into the tuple of its URLs.
    nats_url: tuple[str, ...] | None = None
    # Authentication (at most one method) and TLS.
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_nkey_seed_file: FilePath | None = None
    nats_creds_file: FilePath | None = None
    nats_tls_ca_file: FilePath | None = None
    nats_tls_cert_file: FilePath | None = None
    nats_tls_key_file: FilePath | None = None
    partitions: Annotated[int, Field(ge=1, le=1024)] = 16
    # Copies JetStream keeps of each stream: 3 on a 3-node cluster, so losing a node loses nothing.
    stream_replicas: Annotated[int, Field(ge=1, le=5)] = 1
    # The tenants whose runtime users the embedded server and `python -m infra.nats_accounts` generate.
    tenants: str = DEFAULT_TENANT

    @field_validator("nats_url", mode="before")
    @classmethod
    def _nats_urls(cls, value: object) -> tuple[str, ...] | None:
        if value is None:
            return None
        if isinstance(value, str) or (
            isinstance(value, Sequence) and all(isinstance(url, str) for url in value)
        ):
            return parse_nats_urls(value)
        raise ValueError("must be nats:// URLs, comma-separated for a cluster")

    @field_validator("tenants")
    @classmethod
    def _tenant_names(cls, value: str) -> str:
        parse_tenants(value)
        return value

    @model_validator(mode="after")
    def _one_method(self) -> BusSettings:
        methods = [
            name
            for name, present in (
                ("CTX_NATS_USER", self.nats_user is not None),
                ("CTX_NATS_TOKEN", self.nats_token is not None),
                ("CTX_NATS_NKEY_SEED_FILE", self.nats_nkey_seed_file is not None),
                ("CTX_NATS_CREDS_FILE", self.nats_creds_file is not None),
                ("credentials in CTX_NATS_URL", any(map(url_credentials, self.nats_url or ()))),
            )
            if present
        ]
        if len(methods) > 1:
            raise ValueError(f"choose one NATS authentication method, not {' and '.join(methods)}")
        if (self.nats_user is None) != (self.nats_password is None):
            raise ValueError("CTX_NATS_USER and CTX_NATS_PASSWORD go together")
        if (self.nats_tls_cert_file is None) != (self.nats_tls_key_file is None):
            raise ValueError("CTX_NATS_TLS_CERT_FILE and CTX_NATS_TLS_KEY_FILE go together")
        return self

    @property
    def tenant_names(self) -> tuple[str, ...]:
        """The configured tenants (``CTX_TENANTS``), each a valid subject token, in order, once each."""
        return parse_tenants(self.tenants)

    def nats_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``: credentials and TLS as configured."""
        options: dict[str, Any] = {}
        if self.nats_user is not None and self.nats_password is not None:
            options["user"] = self.nats_user
            options["password"] = self.nats_password.get_secret_value()
        if self.nats_token is not None:
            options["token"] = self.nats_token.get_secret_value()
        if self.nats_nkey_seed_file is not None:
            options["nkeys_seed"] = str(self.nats_nkey_seed_file)
        if self.nats_creds_file is not None:
            options["user_credentials"] = str(self.nats_creds_file)
        if self.nats_tls_ca_file or self.nats_tls_cert_file:
            context = ssl.create_default_context(
                cafile=str(self.nats_tls_ca_file) if self.nats_tls_ca_file else None
            )
            if self.nats_tls_cert_file and self.nats_tls_key_file:
                context.load_cert_chain(str(self.nats_tls_cert_file), str(self.nats_tls_key_file))
            options["tls"] = context
        return options


class StoreSettings(_Group):
    """PostgreSQL: where it is and how many connections a process keeps."""

    # Unset: the embedded server under ``data_dir``.
    database_url: SecretStr | None = None
    # Overrides the password in CTX_DATABASE_URL, so the URL itself can live in a ConfigMap.
    database_password: SecretStr | None = None
    db_pool_size: Annotated[int, Field(ge=2, le=200)] = 10

    @field_validator("database_url")
    @classmethod
    def _database_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and urlsplit(value.get_secret_value()).scheme not in ("postgres", "postgresql"):
            raise ValueError("must be a postgresql:// URL (value not shown: it may hold a password)")
        return value

    @property
    def database_dsn(self) -> str | None:
        """``CTX_DATABASE_URL`` as the driver takes it (it may hold a password: never log it)."""
        value: SecretStr | str | None = self.database_url
        # model_copy(update=...) does not validate, so a plain string can land here.
        return value.get_secret_value() if isinstance(value, SecretStr) else value

    def database_options(self) -> dict[str, Any]:
        """Keyword arguments for ``asyncpg.connect`` / ``create_pool`` beyond the URL."""
        if self.database_password is None:
            return {}
        return {"password": self.database_password.get_secret_value()}


class EmbeddedSettings(_Group):
    """The servers `ctxfleet up` runs itself when no URL names external ones."""

    data_dir: Path = Field(default_factory=default_data_dir)
    # The embedded nats-server's client port, so a client elsewhere knows where to look (0: any free one).
    nats_port: Annotated[int, Field(ge=0, le=65535)] = 4250
    nats_max_payload: Annotated[int, Field(ge=1024 * 1024, le=64 * 1024 * 1024)] = 16 * 1024 * 1024
    # Fsync every write before the ack: a killed single node then loses nothing it acked (NATS's
    # default flushes asynchronously). Costs publish throughput (docs/measurements.md).
    nats_sync_always: bool = True
    # The ceiling of the JetStream store, in MiB. `ctxfleet up` keeps the store within its disk's room
    # below that (infra/embedded.py), and raises it while running as the disk gains room.
    nats_max_store_mb: Annotated[int, Field(ge=1, le=1 << 30)] = 1 << 20
    # Restarts of one server `ctxfleet up` tries within 10 minutes before it stops the fleet instead.
    server_restarts: Annotated[int, Field(ge=0, le=100)] = 3


class ProcessSettings(_Group):
    """What this process runs, who it is, and how it is operated."""

    # The tenant the CLI and a client built from these settings speak for.
    tenant: Annotated[str, AfterValidator(check_tenant)] = DEFAULT_TENANT
    workers: str = ",".join(WORKER_NAMES)
    recorder_partitions: str = "all"
    pod_name: str = Field(default_factory=socket.gethostname)
    recorder_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    # /metrics, /healthz, /readyz and the console on one port (0: not served).
    http_host: str = "127.0.0.1"
    http_port: Annotated[int, Field(ge=0, le=65535)] = 0
    # The console shows every tenant's records, unauthenticated: only to this machine unless told.
    console_remote: bool = False
    shutdown_timeout_s: Annotated[float, Field(gt=0, le=600)] = 25.0
    # How long `ctxfleet worker` waits for migrations, provisioning and the servers before giving up.
    startup_wait_s: Annotated[float, Field(ge=0, le=3600)] = 0.0
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    # OpenTelemetry spans: off, or exported over OTLP/HTTP as the standard OTEL_* variables configure.
    traces: Literal["off", "otlp"] = "off"

    @field_validator("workers")
    @classmethod
    def _known_workers(cls, value: str) -> str:
        names = [w.strip() for w in value.split(",") if w.strip()]
        unknown = sorted(set(names) - set(WORKER_NAMES))
        if unknown or not names:
            raise ValueError(f"unknown workers {unknown}; this build runs: {', '.join(sorted(WORKER_NAMES))}")
        return ",".join(names)

    @property
    def worker_names(self) -> tuple[str, ...]:
        """The workers this process runs."""
        return tuple(self.workers.split(","))


class LimitsSettings(_Group):
    """What bounds the input a fleet accepts and the work and memory it takes on for it."""

    max_event_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    tool_result_max_tokens: Annotated[int, Field(ge=50)] = 2000
    # A user input over this is recorded as its head and tail, the whole readable back (see
    # docs/wire.md, "Limits"): keep it well under the smallest input budget the fleet's prepares use.
    user_input_max_tokens: Annotated[int, Field(ge=200)] = 32_000
    compaction_wait_ms: Annotated[int, Field(ge=0, le=120_000)] = 5_000
    # Request/reply admission per process: requests computing at once (waits excluded), and how
    # long one may queue for a slot before it is answered `overloaded` instead.
    max_inflight_requests: Annotated[int, Field(ge=1, le=4096)] = 64
    max_queue_age_ms: Annotated[int, Field(ge=0, le=60_000)] = 500
    # Records of answered contexts waiting to be stored (through a database outage) at most, by count
    # and by estimated MiB; at either bound prepares are answered `overloaded` until they are stored.
    gateway_pending_records: Annotated[int, Field(ge=1, le=10_000_000)] = 10_000
    gateway_pending_mb: Annotated[int, Field(ge=1, le=1_048_576)] = 64


class TuningSettings(_Group):
    """What an operator may trade: throughput and memory."""

    record_batch: Annotated[int, Field(ge=1, le=4096)] = 256
    # The per-process cache of thread views (records and the blocks built of them), in MiB.
    view_cache_mb: Annotated[int, Field(ge=1, le=1_048_576)] = 256


class CompactionSettings(_Group):
    """Which summarizer the compactor calls."""

    summarizer: Literal["structured", "openai"] = "structured"
    summarizer_base_url: str | None = None
    summarizer_model: str | None = None
    summarizer_api: Literal["chat_completions", "responses"] = "chat_completions"
    summarizer_api_key: SecretStr | None = None

    @model_validator(mode="after")
    def _endpoint_named(self) -> CompactionSettings:
        if self.summarizer == "openai" and not (self.summarizer_base_url and self.summarizer_model):
            raise ValueError("CTX_SUMMARIZER=openai needs CTX_SUMMARIZER_BASE_URL and CTX_SUMMARIZER_MODEL")
        return self


# Each group in the order the documentation shows it.
GROUPS: dict[str, type[BaseModel]] = {
    "bus": BusSettings,
    "store": StoreSettings,
    "embedded": EmbeddedSettings,
    "process": ProcessSettings,
    "limits": LimitsSettings,
    "tuning": TuningSettings,
    "compaction": CompactionSettings,
}
# Setting names are unique across groups: each is one variable, ``CTX_<NAME>``.
GROUP_OF: dict[str, str] = {name: group for group, model in GROUPS.items() for name in model.model_fields}


class Settings(BaseSettings):
    """Every knob of the fleet, in groups. Unset URLs mean: start the embedded servers.

    Each setting is read from ``CTX_<NAME>``, whatever its group; the constructor and :meth:`replace`
    take the same flat names (``Settings(nats_url=…, partitions=4)``).
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    bus: BusSettings = Field(default_factory=BusSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    process: ProcessSettings = Field(default_factory=ProcessSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    tuning: TuningSettings = Field(default_factory=TuningSettings)
    compaction: CompactionSettings = Field(default_factory=CompactionSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _FlatEnv(settings_cls), _SecretFiles(settings_cls))

    @classmethod
    def env_names(cls) -> frozenset[str]:
        """Every environment variable the fleet reads."""
        names = {f"{ENV_PREFIX}{name.upper()}" for name in GROUP_OF}
        names |= {f"{ENV_PREFIX}{name.upper()}_FILE" for name in SECRET_FIELDS}
        return frozenset(names)

    @model_validator(mode="before")
    @classmethod
    def _grouped(cls, values: Any) -> Any:
        """Flat names (from the environment, files or keywords) into their groups."""
        if not isinstance(values, dict):
            return values
        flat: dict[str, dict[str, Any]] = {}
        rest: dict[str, Any] = {}
        for key, value in values.items():
            if key in GROUP_OF:
                flat.setdefault(GROUP_OF[key], {})[key] = value
            else:
                rest[key] = value
        for group, named in flat.items():
            given = rest.get(group)
            if isinstance(given, BaseModel):
                given = given.model_dump()
            # A group given whole wins over flat names of its settings.
            rest[group] = {**named, **(given or {})}
        return rest

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        self.owned_partitions()  # a bad CTX_RECORDER_PARTITIONS stops the process here, not at first fetch
        return self

    def owned_partitions(self) -> tuple[int, ...]:
        """The events partitions this process records."""
        spec = self.process.recorder_partitions
        try:
            return parse_partitions(spec, self.bus.partitions, pod_name=self.process.pod_name)
        except ValueError as exc:
            raise ValueError(f"CTX_RECORDER_PARTITIONS={spec!r}: {exc}") from None

    def replace(self, **changes: Any) -> Settings:
        """These settings with ``changes`` (flat names), unvalidated like ``model_copy``."""
        groups: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            groups.setdefault(GROUP_OF[name], {})[name] = value
        return self.model_copy(
            update={group: getattr(self, group).model_copy(update=update) for group, update in groups.items()}
        )


def load_settings(**overrides: Any) -> Settings:
    """The settings from the environment, or ``InvalidConfiguration`` naming each bad variable.

    Values are not echoed: a rejected secret must not end up in a log.
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            # ("bus", "partitions") names CTX_PARTITIONS; ("bus",) is a rule across a group's settings.
            name = next((str(x) for x in error["loc"] if x in GROUP_OF), None)
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{ENV_PREFIX}{name.upper()}: {message}" if name else message)
        raise InvalidConfiguration(problems) from None
