"""Provisioning rides over the server's teardown of a stream just deleted, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import APIError, NotFoundError, ServerError

from infra import provision

pytestmark = pytest.mark.anyio


class _JetStream:
    """Fails ``add_stream`` with the given errors, then accepts it."""

    def __init__(self, *failures: APIError) -> None:
        self.failures = list(failures)
        self.attempts = 0

    async def stream_info(self, name: str) -> Any:
        raise NotFoundError()

    async def add_stream(self, config: StreamConfig) -> None:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)


def _store_busy() -> APIError:
    return ServerError(code=500, err_code=10049, description="error creating store for stream")


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    async def instant(_: float) -> None:
        return None

    monkeypatch.setattr(provision.asyncio, "sleep", instant)


async def test_a_stream_whose_store_is_still_being_torn_down_is_created_on_a_later_attempt() -> None:
    js = _JetStream(_store_busy(), _store_busy())
    assert await provision._ensure(js, StreamConfig(name="S", subjects=["s.>"]), None, False) == "created"  # type: ignore[arg-type]
    assert js.attempts == 3


async def test_a_store_that_never_becomes_free_is_reported_after_the_last_attempt() -> None:
    js = _JetStream(*[_store_busy() for _ in range(20)])
    with pytest.raises(APIError):
        await provision._ensure(js, StreamConfig(name="S", subjects=["s.>"]), None, False)  # type: ignore[arg-type]
    assert js.attempts == provision._STORE_BUSY_RETRIES


async def test_any_other_refusal_is_reported_at_once() -> None:
    js = _JetStream(ServerError(code=500, err_code=10052, description="invalid stream config"))
    with pytest.raises(APIError):
        await provision._ensure(js, StreamConfig(name="S", subjects=["s.>"]), None, False)  # type: ignore[arg-type]
    assert js.attempts == 1
