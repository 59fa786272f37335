"""The far link of the think benchmark passes every byte intact, in order, and late by its delay.

A runtime in another zone is simulated by it; a link that lost, reordered or failed to delay bytes
would make the far figures measure something else.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from benchmarks.far_link import FarLink

pytestmark = pytest.mark.anyio

DELAY_MS = 25.0


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_a_round_trip_through_the_link_is_intact_and_late_by_twice_its_delay(tmp_path: Path) -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    payload = bytes(range(256)) * 800  # 200 KB: many chunks, in order
    async with server:
        with FarLink(f"127.0.0.1:{port}", DELAY_MS, tmp_path) as link:
            reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
            started = time.monotonic()
            writer.write(payload)
            await writer.drain()
            echoed = await reader.readexactly(len(payload))
            took_ms = (time.monotonic() - started) * 1000
            writer.close()
    assert echoed == payload
    assert took_ms >= 2 * DELAY_MS
