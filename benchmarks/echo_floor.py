"""The floor under a prepare round trip: a process that answers every request with the same bytes.

A prepare's time at the client is the transport (the request to NATS and on to a fleet process, the
reply back), the client's parse of the reply, and what the fleet does in between. ``EchoFloor`` runs
the first two alone: a nats-py subscriber in a process of its own that answers each request with a
fixed body — a real prepared context's bytes — so a benchmark can time it beside the prepare, the same
request and the same parse, and say how much of a figure is the fleet's.

``python -m benchmarks.echo_floor NATS_URL SUBJECT BODY_FILE`` is the responder process itself.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from types import TracebackType

import nats
from nats.aio.msg import Msg

from services.settings import parse_nats_urls

from .fleet_process import ROOT

__all__ = ["EchoFloor"]


class EchoFloor:
    """A responder process on ``subject`` (wildcards allowed) answering with ``body``; ready on enter."""

    def __init__(self, nats_url: str, subject: str, body: bytes, workdir: Path) -> None:
        self._nats_url, self._subject, self._body = nats_url, subject, body
        self._body_file = workdir / "echo-floor.body"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> EchoFloor:
        self._body_file.write_bytes(self._body)
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.echo_floor",
                self._nats_url,
                self._subject,
                str(self._body_file),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
        )
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != b"ready":
            self.stop()
            raise RuntimeError("the echo responder did not start")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


async def _serve(nats_url: str, subject: str, body: bytes) -> None:
    nc = await nats.connect(list(parse_nats_urls(nats_url)), name="echo-floor")

    async def answer(msg: Msg) -> None:
        if msg.reply:
            await nc.publish(msg.reply, body, headers={"ctx-status": "ok"})

    await nc.subscribe(subject, cb=answer)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    url, subject_arg, path = sys.argv[1:4]
    asyncio.run(_serve(url, subject_arg, Path(path).read_bytes()))
