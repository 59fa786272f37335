"""The embedded default's credentials: one NATS user per identity, generated once per data folder.

``make run`` must not leave the bus (or the database) open to any local process: its nats-server accepts only
the users of ``infra.nats_accounts.embedded_grants`` (each worker kind, provisioning, the all-in-one ``fleet``
process, ``operator`` for people and the CLI, and ``runtime-<tenant>`` for each tenant's agent runtimes).
Their passwords are random, made on first start and kept in ``<data folder>/credentials.json`` (0600), so a
restart keeps them and clients in other terminals of the same user find them; other users of the machine
cannot read them. The data folder itself is 0711: nobody else may list it, but the embedded PostgreSQL — which
runs as its own system user when started by root — must reach its cluster (0700, its own) through it; the
broker's store and config are 0700 / 0600.

Processes of this checkout pick their identity with :func:`as_identity`: when no NATS URL or
credentials are configured (the embedded default), the settings get that user's password from
the data folder; configured settings are never overridden. The embedded PostgreSQL's superuser
gets a generated password too: local connections must give it, whoever can reach the socket.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from services.settings import Settings

from .nats_accounts import DEFAULT_TENANTS, embedded_grants

__all__ = [
    "CREDENTIALS_FILE",
    "DATA_FOLDER_MODE",
    "EmbeddedCredentials",
    "as_identity",
    "load_credentials",
    "load_or_create_credentials",
    "secure_folder",
]

CREDENTIALS_FILE = "credentials.json"
# Listing refused to others; traversal allowed, for the embedded PostgreSQL's own user (see above).
DATA_FOLDER_MODE = 0o711


@dataclass(frozen=True)
class EmbeddedCredentials:
    """The embedded servers' users and their passwords."""

    nats: Mapping[str, str]
    # The embedded PostgreSQL superuser's (``""`` in a file written before it had one).
    postgres: str = ""

    def password(self, user: str) -> str:
        """``user``'s password; KeyError for a user the server does not know."""
        return self.nats[user]


def secure_folder(path: Path, mode: int = 0o700) -> None:
    """Create ``path`` if needed and make it the owner's alone (0700 unless told otherwise)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)


def load_credentials(data_dir: Path) -> EmbeddedCredentials | None:
    """The data folder's credentials, ``None`` if it has none (no embedded fleet ever ran there)."""
    try:
        raw = json.loads((data_dir / CREDENTIALS_FILE).read_text())
    except FileNotFoundError:
        return None
    nats = raw.get("nats") if isinstance(raw, dict) else None
    postgres = raw.get("postgres", "") if isinstance(raw, dict) else None
    if (
        not isinstance(nats, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in nats.items())
        or not isinstance(postgres, str)
    ):
        raise ValueError(
            f"{data_dir / CREDENTIALS_FILE} is not a credentials file: remove it to generate new ones"
        )
    return EmbeddedCredentials(nats=dict(nats), postgres=postgres)


def load_or_create_credentials(
    data_dir: Path, tenants: Iterable[str] = DEFAULT_TENANTS
) -> EmbeddedCredentials:
    """The data folder's credentials, completed with a password for every user the server needs.

    Passwords already there are kept (clients of a running fleet keep working across restarts); a
    user added by a newer build or a tenant added to ``CTX_TENANTS`` gets a new one, and a tenant
    taken out of it loses its user.
    """
    secure_folder(data_dir, DATA_FOLDER_MODE)
    current = load_credentials(data_dir)
    known = dict(current.nats) if current is not None else {}
    wanted = {user: known.get(user) or secrets.token_urlsafe(24) for user in embedded_grants(tenants)}
    postgres = (current.postgres if current is not None else "") or secrets.token_urlsafe(24)
    if current is None or wanted != known or postgres != current.postgres:
        path = data_dir / CREDENTIALS_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"nats": wanted, "postgres": postgres}, f, indent=2, sort_keys=True)
        os.chmod(tmp, 0o600)
        tmp.replace(path)
    return EmbeddedCredentials(nats=wanted, postgres=postgres)


def _configured(settings: Settings) -> bool:
    return settings.bus.nats_url is not None or any(
        v is not None
        for v in (
            settings.bus.nats_user,
            settings.bus.nats_token,
            settings.bus.nats_nkey_seed_file,
            settings.bus.nats_creds_file,
        )
    )


def as_identity(settings: Settings, user: str) -> Settings:
    """``settings`` connecting to the embedded fleet as ``user`` (unchanged when NATS is configured)."""
    if _configured(settings):
        return settings
    found = load_credentials(settings.embedded.data_dir)
    if found is None or user not in found.nats:
        return settings
    return settings.replace(nats_user=user, nats_password=SecretStr(found.password(user)))
