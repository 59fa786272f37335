"""The settings tables of docs/configuration.md, written from the ``Settings`` model.

One table per group of settings (``bus``, ``store``, …), headed by the group's docstring. The
variable names, defaults, accepted values and which settings are secrets come from
``services.settings.Settings`` itself; only the one-line meaning of each setting is written here, so a
setting added to the model without a meaning fails ``tests/unit/test_settings_doc.py``, and so does a
committed table that differs from what this module writes.

    python -m infra.settings_doc            # rewrite the table in docs/configuration.md
    python -m infra.settings_doc --check    # exit 1 if the committed table is not what it would write
"""

from __future__ import annotations

import argparse
import sys
import types
import typing
from pathlib import Path

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from services.settings import ENV_PREFIX, SECRET_FIELDS, Settings

__all__ = ["BEGIN", "DOC", "END", "MEANINGS", "groups_of", "main", "render_table", "rewrite", "table_of"]

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- settings table: written by `python -m infra.settings_doc` from services/settings.py -->"
END = "<!-- end of settings table -->"

# Defaults computed when the process starts, shown as what they are made of.
_COMPUTED_DEFAULTS = {
    "data_dir": "`<checkout>/.ctxfleet`",
    "pod_name": "host name",
    "recorder_id": "`<host>-<pid>`",
}

MEANINGS: dict[str, str] = {
    "nats_url": (
        "NATS server(s) to use (nats-server ≥ 2.10, JetStream on); unset: the embedded server. "
        "Comma-separated for a cluster; credentials in any one URL serve for all "
        "([a 3-node cluster](operating.md#a-3-node-jetstream-cluster))"
    ),
    "database_url": "PostgreSQL URL (`postgresql://…`); unset: the embedded server",
    "data_dir": "the embedded servers' data and the running fleet's `endpoints.json` and credentials",
    "nats_user": "user/password authentication (with `CTX_NATS_PASSWORD`)",
    "nats_password": "the NATS user's password",
    "nats_token": "token authentication",
    "nats_nkey_seed_file": "NKey authentication: the user's seed file",
    "nats_creds_file": "JWT authentication: a `.creds` file (one authentication method at a time)",
    "nats_tls_ca_file": "CA bundle to verify the server (turns TLS on)",
    "nats_tls_cert_file": "client certificate for mutual TLS (with `CTX_NATS_TLS_KEY_FILE`)",
    "nats_tls_key_file": "client key for mutual TLS (with `CTX_NATS_TLS_CERT_FILE`)",
    "nats_max_payload": "`max_payload` of the embedded nats-server (must exceed the event limit)",
    "nats_port": (
        "client port of the embedded nats-server (`ctxfleet env` prints the URL); when taken: the last "
        "run's port or any free one, logged; `0`: any free port"
    ),
    "nats_sync_always": (
        "the embedded nats-server fsyncs each message before acking it, so a killed single node loses "
        "nothing it acked; `false`: NATS's asynchronous flush (faster publishes, see "
        "[measurements](measurements.md)); a cluster gets the same from `CTX_STREAM_REPLICAS=3`"
    ),
    "nats_max_store_mb": (
        "ceiling of the embedded JetStream store (MiB); `ctxfleet up` keeps it within the disk's room "
        "([disk full](operating.md#disk-full-and-read-only-data-folder))"
    ),
    "stream_replicas": (
        "copies JetStream keeps of each stream (`ctxfleet provision`); `3` on a 3-node cluster"
    ),
    "database_password": "overrides the URL's password, so the URL can live in a ConfigMap",
    "db_pool_size": "PostgreSQL connections per process (opened when needed, then kept)",
    "tenants": (
        "tenants whose runtime users `runtime-<tenant>` the embedded server and "
        "`python -m infra.nats_accounts` generate ([tenants](operating.md#tenants))"
    ),
    "tenant": "the tenant the CLI and a client built from these settings speak for (`--tenant` overrides it)",
    "workers": "workers this process runs (`ctxfleet worker NAME` sets it)",
    "partitions": "partitions of the events stream (fixed when the stream is provisioned)",
    "recorder_partitions": (
        "partitions this process records: `all`, `0-7,12`, `i/k`, or `pod/k` (i: the ordinal of "
        "`CTX_POD_NAME`)"
    ),
    "pod_name": "the StatefulSet pod name (`…-3` → ordinal 3), set from the downward API",
    "recorder_id": "name stored with each record (`recorded_by`)",
    "record_batch": "most events per fetch and per transaction",
    "max_event_bytes": "events above this are dead-lettered `payload_too_large`",
    "tool_result_max_tokens": "tool results above this are shown as head + tail (fixed at recording)",
    "user_input_max_tokens": (
        "user inputs above this are shown as head + tail, the whole readable back with `context_read` "
        "(fixed at recording; keep it well under the smallest input budget your prepares use)"
    ),
    "compaction_wait_ms": "how long an over-budget prepare waits for its thread's compaction",
    "view_cache_mb": (
        "bound (MiB, estimated) of the per-process cache of thread views the assembler, budgeter and "
        "compactor share; least recently used threads leave first"
    ),
    "gateway_pending_records": (
        "records of answered contexts kept until stored (through a PostgreSQL outage); at this bound "
        "prepares are answered `overloaded`"
    ),
    "gateway_pending_mb": "the same bound in MiB (estimated)",
    "max_inflight_requests": (
        "requests computing at once per process (waiting for an event or a compaction holds no slot); "
        "at most 4× as many queue for one"
    ),
    "max_queue_age_ms": "how long a request may queue for a slot before it is answered `overloaded`",
    "summarizer": "`structured` (deterministic) or `openai` (any OpenAI-compatible endpoint)",
    "summarizer_base_url": "required with `openai`, e.g. `https://…/v1`",
    "summarizer_model": "required with `openai`, e.g. `gpt-4o-mini`",
    "summarizer_api": "which OpenAI API the `openai` summarizer calls",
    "summarizer_api_key": "bearer key of the summarizer endpoint; never logged or echoed",
    "http_host": "where `/metrics`, `/healthz`, `/readyz` and the console listen (`0.0.0.0` in the image)",
    "http_port": (
        "their port (`0`: not served; `9464` in the image); `ctxfleet up` picks a free one when unset"
    ),
    "console_remote": (
        "whether the console answers clients on other machines; by default only loopback peers see it "
        "(it shows every tenant's records, unauthenticated)"
    ),
    "shutdown_timeout_s": "on SIGTERM: stop pulling, finish and ack what is in hand, exit within this bound",
    "startup_wait_s": (
        "how long `ctxfleet worker` waits (live, not ready) for migrations, provisioning and the servers "
        "before exiting with code 2 (`300` in Kubernetes)"
    ),
    "server_restarts": (
        "restarts of one embedded server `ctxfleet up` tries within 10 minutes before it stops the fleet "
        "(`0`: stop on the first exit)"
    ),
    "log_level": "how much the process logs (`-v` raises `WARNING` to `INFO`)",
    "traces": (
        "OpenTelemetry spans of prepares, compactions, rollovers and hook calls: `otlp` exports them over "
        "OTLP/HTTP to `OTEL_EXPORTER_OTLP_ENDPOINT` (see docs/operating.md, Traces)"
    ),
}


def _default(name: str, field: FieldInfo) -> str:
    if name in _COMPUTED_DEFAULTS:
        return _COMPUTED_DEFAULTS[name]
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}  # lower bounds first


def _bounds(field: FieldInfo) -> str:
    found = {a: v for rule in field.metadata for a in _BOUNDS if (v := getattr(rule, a, None)) is not None}
    return ", ".join(f"{_BOUNDS[a]} {found[a]}" for a in _BOUNDS if a in found)


def _accepted(name: str, field: FieldInfo) -> str:
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if typing.get_origin(annotation) is typing.Literal:
        return " / ".join(f"`{choice}`" for choice in typing.get_args(annotation))
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    kinds: dict[object, str] = {
        bool: "`true` / `false`",
        int: "integer",
        float: "number",
        str: "text",
        Path: "path",
        SecretStr: "text (secret)",
    }
    if name == "nats_url":
        kind = "URLs"
    elif name.endswith("_file"):
        kind = "path of an existing file"
    else:
        kind = kinds.get(annotation, "text")
    bounds = _bounds(field)
    return f"{kind} {bounds}" if bounds else kind


def groups_of(model: type[Settings] = Settings) -> list[tuple[str, type[BaseModel]]]:
    """``(name, model)`` of each group of settings, in the model's order."""
    groups = []
    for name, field in model.model_fields.items():
        group = field.annotation
        assert isinstance(group, type) and issubclass(group, BaseModel), f"{name} is not a group"
        groups.append((name, group))
    return groups


def table_of(group: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """One row per setting of ``group``: variable (and its ``_FILE`` form for secrets), default,
    accepted, meaning.

    Raises ``KeyError`` naming a setting that has no meaning written in ``MEANINGS``.
    """
    missing = [name for name in group.model_fields if name not in MEANINGS]
    if missing:
        raise KeyError(f"settings without a meaning in infra/settings_doc.py: {', '.join(missing)}")
    rows = []
    for name, field in group.model_fields.items():
        variable = f"`{ENV_PREFIX}{name.upper()}`"
        if name in SECRET_FIELDS:
            variable += f", `{ENV_PREFIX}{name.upper()}_FILE`"
        rows.append((variable, _default(name, field), _accepted(name, field), MEANINGS[name]))
    return rows


def render_table(model: type[Settings] = Settings) -> str:
    """The Markdown between the ``BEGIN`` and ``END`` markers: a heading and a table per group."""
    parts = []
    for name, group in groups_of(model):
        about = (group.__doc__ or "").strip().split("\n", 1)[0]
        lines = [f"### `{name}` — {about}", ""]
        lines += ["| variable | default | accepted | meaning |", "|---|---|---|---|"]
        lines += [f"| {' | '.join(row)} |" for row in table_of(group)]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def rewrite(text: str, table: str) -> str:
    """``text`` with what lies between the markers replaced by ``table``."""
    head, found, rest = text.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise ValueError(f"{DOC.name} lacks the markers {BEGIN!r} … {END!r}")
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.settings_doc", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed table is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    wanted = rewrite(text, render_table())
    if args.check:
        if wanted != text:
            print(f"{DOC}: the settings table is stale; run python -m infra.settings_doc", file=sys.stderr)
            return 1
        return 0
    if wanted != text:
        DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
