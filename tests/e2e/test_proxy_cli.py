"""``ctxfleet proxy`` as a process: it reaches the fleet through the ``ctxfleet env`` lines."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx2
import openai
import pytest

from infra.embedded import free_port
from tests.fixtures.fleet import eventually
from tests.fixtures.scripted_upstream import Said, ScriptedUpstream, serve

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.nats]
ROOT = Path(__file__).resolve().parents[2]


async def test_proxy_command_serves_the_sdk_and_records_in_the_fleet_of_its_env(
    fleet: Any, streams: str, db: asyncpg.Connection
) -> None:
    upstream = ScriptedUpstream()
    upstream.script(Said(text="Hello from upstream."))
    port = free_port()
    async with serve(upstream.app()) as upstream_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
        env |= {"CTX_NATS_URL": streams, "CTX_TENANT": "default"}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "infra.cli",
            "proxy",
            "--port",
            str(port),
            "--openai-url",
            f"{upstream_url}/v1",
            "--budget-tokens",
            "4000",
            cwd=ROOT,
            env=env,
        )
        try:
            async with httpx2.AsyncClient() as http:

                async def listening() -> bool:
                    try:
                        await http.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=b"{}")
                    except httpx2.TransportError:
                        return False
                    return True

                await eventually(listening, timeout=30, what="the proxy to listen")
            thread = f"r-{uuid.uuid4().hex[:10]}"
            async with openai.AsyncOpenAI(
                api_key="sk-caller",
                base_url=f"http://127.0.0.1:{port}/v1",
                default_headers={"ctx-thread": thread},
                max_retries=0,
            ) as sdk:
                reply = await sdk.chat.completions.create(
                    model="some-model", messages=[{"role": "user", "content": "Hi."}]
                )
        finally:
            process.terminate()
            await process.wait()
    assert reply.choices[0].message.content == "Hello from upstream."
    assert upstream.received[0].headers["authorization"] == "Bearer sk-caller"

    async def recorded() -> bool:
        count = await db.fetchval("SELECT count(*) FROM ctx.records WHERE thread_id = $1", f"{thread}.main")
        return int(count) == 2

    await eventually(recorded, what="the question and the answer recorded")
