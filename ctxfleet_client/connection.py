"""Where the fleet's NATS servers are and who connects: URLs, credentials, and the environment.

``from_env`` reads exactly the lines ``ctxfleet env`` prints (``eval "$(ctxfleet env)"``):
``CTX_NATS_URL`` (one server, or a cluster's comma-separated), ``CTX_NATS_USER``,
``CTX_NATS_PASSWORD`` and ``CTX_TENANT``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from contracts.subjects import DEFAULT_TENANT, check_tenant

__all__ = [
    "ENV_NATS_PASSWORD",
    "ENV_NATS_URL",
    "ENV_NATS_USER",
    "ENV_TENANT",
    "FleetAddress",
    "nats_connection",
    "parse_nats_urls",
    "redact_url",
    "url_credentials",
]

ENV_NATS_URL = "CTX_NATS_URL"
ENV_NATS_USER = "CTX_NATS_USER"
ENV_NATS_PASSWORD = "CTX_NATS_PASSWORD"
ENV_TENANT = "CTX_TENANT"


@dataclass(frozen=True, slots=True)
class FleetAddress:
    """The servers, identity and tenant a client connects with."""

    servers: tuple[str, ...]
    user: str | None = None
    password: str | None = None
    tenant: str = DEFAULT_TENANT

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FleetAddress:
        """The address ``ctxfleet env`` printed, read from ``environ`` (default ``os.environ``).

        Raises:
            ValueError: ``CTX_NATS_URL`` is unset or not nats:// URLs, ``CTX_TENANT`` is not a tenant
                name, or a password comes without its user.
        """
        env = os.environ if environ is None else environ
        spec = env.get(ENV_NATS_URL, "").strip()
        if not spec:
            raise ValueError(f'{ENV_NATS_URL} is not set: run eval "$(ctxfleet env)" first')
        user = env.get(ENV_NATS_USER) or None
        password = env.get(ENV_NATS_PASSWORD) or None
        if password is not None and user is None:
            raise ValueError(f"{ENV_NATS_PASSWORD} is set without {ENV_NATS_USER}")
        tenant = check_tenant(env.get(ENV_TENANT) or DEFAULT_TENANT)
        return cls(parse_nats_urls(spec), user, password, tenant)

    def options(self) -> dict[str, Any]:
        """The credentials as ``nats.connect`` takes them (none when the URLs carry them)."""
        if self.user is None:
            return {}
        return {"user": self.user, "password": self.password}


def redact_url(url: str | None) -> str:
    """``url`` without its password, for logs and messages."""
    if not url:
        return ""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


_NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def parse_nats_urls(spec: str | Sequence[str]) -> tuple[str, ...]:
    """``CTX_NATS_URL`` as the URLs it names: one server, or a cluster's comma-separated.

    Each URL is stripped of surrounding whitespace and kept as written otherwise. Raises
    ``ValueError`` (a message that never echoes a password) for an empty list or an empty part, a
    scheme other than nats/tls/ws/wss, a URL without a host or with a bad port, websocket URLs mixed
    with others (nats-py refuses the mix), or URLs naming different credentials: one fleet identity
    connects to every server, and the credentials of one URL are used for all (``nats_connection``).
    """
    parts = [spec] if isinstance(spec, str) else list(spec)
    urls = tuple(url.strip() for part in parts for url in part.split(","))
    if not any(urls):
        raise ValueError("name at least one nats:// URL")
    for position, url in enumerate(urls, start=1):
        if not url:
            raise ValueError(f"URL {position} of {len(urls)} is empty (a stray comma?)")
        _check_nats_url(url)
    if len({_is_websocket(url) for url in urls}) > 1:
        raise ValueError("websocket (ws://, wss://) and nats:// or tls:// URLs cannot be mixed")
    if len({credentials for url in urls if (credentials := url_credentials(url))}) > 1:
        raise ValueError("the URLs carry different credentials; give one user (or token) in any of them")
    return urls


def _check_nats_url(url: str) -> None:
    shown = repr(redact_url(url))
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in range
    except ValueError:
        raise ValueError(f"{shown} is not a URL (bad port?)") from None
    if parts.scheme not in _NATS_SCHEMES:
        raise ValueError(f"must be nats://, tls://, ws:// or wss:// URLs, got {shown}")
    if not parts.hostname:
        raise ValueError(f"{shown} names no host")


def _is_websocket(url: str) -> bool:
    return urlsplit(url).scheme in ("ws", "wss")


def url_credentials(url: str) -> tuple[str, str | None] | None:
    """``(user, password)`` or ``(token, None)`` in a URL, percent-decoded; ``None`` without any."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    return unquote(parts.username), None if parts.password is None else unquote(parts.password)


def _without_credentials(parts: SplitResult) -> str:
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def nats_connection(
    servers: str | Sequence[str], options: dict[str, Any]
) -> tuple[list[str], dict[str, Any]]:
    """The server list and connect options for ``nats.connect`` (or FastStream's broker).

    Credentials written in any of the URLs become the connection's ``user``/``password`` (or
    ``token``) unless ``options`` name an authentication method already, and leave the URLs: nats-py
    would otherwise send them only to the server whose URL holds them, not to the other URLs, nor to
    servers it discovers from the cluster, and FastStream refuses URL credentials beside ``security``.
    """
    urls = parse_nats_urls(servers)
    merged = dict(options)
    credentials = next((c for url in urls if (c := url_credentials(url))), None)
    has_method = any(key in merged for key in ("user", "token", "nkeys_seed", "user_credentials"))
    if credentials is not None and not has_method:
        user, password = credentials
        merged.update({"user": user, "password": password} if password is not None else {"token": user})
    return [_without_credentials(urlsplit(url)) for url in urls], merged
