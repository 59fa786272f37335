"""``ctxfleet proxy``: serve the provider APIs on loopback with the fleet's context in between
(docs/frameworks.md, "The proxy")."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx2
import uvicorn

from ctxfleet_client import FleetClient
from services.edge.proxy import ProxyConfig, build_app
from services.settings import Settings

__all__ = ["add_proxy_command"]


def add_proxy_command(sub: Any) -> None:
    proxy = sub.add_parser(
        "proxy",
        help="serve the OpenAI and Anthropic APIs, each request's context prepared by the fleet",
        description=(
            "Connects to the fleet as the CTX_* lines of 'ctxfleet env' say (CTX_NATS_URL, "
            "CTX_NATS_USER, CTX_NATS_PASSWORD, CTX_TENANT) and forwards each request upstream with "
            "the caller's own Authorization / x-api-key."
        ),
    )
    proxy.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    proxy.add_argument("--port", type=int, default=8787, help="listen port (default 8787)")
    proxy.add_argument(
        "--openai-url",
        default=ProxyConfig.openai_url,
        help="upstream of /v1/chat/completions and /v1/responses (default %(default)s)",
    )
    proxy.add_argument(
        "--anthropic-url",
        default=ProxyConfig.anthropic_url,
        help="upstream of /v1/messages (default %(default)s)",
    )
    proxy.add_argument(
        "--budget-tokens",
        type=int,
        help="cap every context at this many tokens (required for models without a built-in profile)",
    )
    proxy.set_defaults(func=_cmd_proxy)


def _cmd_proxy(args: argparse.Namespace, settings: Settings) -> int:
    config = ProxyConfig(
        openai_url=args.openai_url.rstrip("/"),
        anthropic_url=args.anthropic_url.rstrip("/"),
        budget_tokens=args.budget_tokens,
    )
    asyncio.run(_serve(config, args.host, args.port))
    return 0


async def _serve(config: ProxyConfig, host: str, port: int) -> None:
    async with await FleetClient.from_env(name="ctxfleet-proxy") as client, httpx2.AsyncClient() as http:
        app = build_app(client, http, config)
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()
