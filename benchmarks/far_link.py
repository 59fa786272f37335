"""A TCP link that delays every byte by a fixed time each way: a runtime far from its broker.

``python -m benchmarks.far_link --to HOST:PORT --delay-ms D --port-file F`` listens on a free loopback
port (written to ``F`` once it listens) and forwards each connection to ``HOST:PORT``, holding every
chunk ``D`` ms before passing it on, in order, in both directions — a round trip then costs ``2·D``
more, as it would for a runtime in another zone. Run in its own process, so its timers never share
the measuring process's event loop (``FarLink`` starts and stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

__all__ = ["FarLink"]


class FarLink:
    """``far_link`` in a child process, between this process and ``target`` (``host:port``)."""

    def __init__(self, target: str, delay_ms: float, tmp: Path) -> None:
        self._target = target
        self._delay_ms = delay_ms
        self._port_file = tmp / f"far-link-{time.monotonic_ns()}.port"
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def __enter__(self) -> FarLink:
        command = [sys.executable, "-m", "benchmarks.far_link", "--to", self._target]
        command += ["--delay-ms", str(self._delay_ms), "--port-file", str(self._port_file)]
        self._proc = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1])
        deadline = time.monotonic() + 10
        while not self._port_file.exists() or not self._port_file.read_text().strip():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"far_link did not start (exit code {self._proc.poll()})")
            time.sleep(0.02)
        self.port = int(self._port_file.read_text())
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Forward ``reader`` to ``writer``, each chunk ``delay_s`` after it arrived, in order."""
    held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, chunk = await held.get()
            if not chunk:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(deliver())
    try:
        while chunk := await reader.read(65536):
            held.put_nowait((time.monotonic() + delay_s, chunk))
    except ConnectionError:
        pass
    held.put_nowait((0.0, b""))
    await sender


async def _serve(target: str, delay_ms: float, port_file: Path) -> None:
    host, _, port = target.rpartition(":")
    delay_s = delay_ms / 1000

    async def link(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(
            _pipe(client_reader, server_writer, delay_s),
            _pipe(server_reader, client_writer, delay_s),
            return_exceptions=True,
        )

    server = await asyncio.start_server(link, "127.0.0.1", 0)
    written = port_file.with_suffix(".tmp")
    written.write_text(str(server.sockets[0].getsockname()[1]))
    written.rename(port_file)  # whole, so the parent never reads half a number
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="added to each direction")
    parser.add_argument("--port-file", type=Path, required=True, help="where the listening port is written")
    args = parser.parse_args()
    asyncio.run(_serve(args.to, args.delay_ms, args.port_file))


if __name__ == "__main__":
    main()
