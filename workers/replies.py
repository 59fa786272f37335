"""Request/reply plumbing shared by the request handlers: raw decode, typed errors, replies."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from faststream.nats import NatsMessage, NatsResponse
from pydantic import BaseModel, ValidationError

from contracts import ErrorCode, ErrorReply
from services.errors import CtxError, InvalidRequest

__all__ = ["error_reply", "parse_body", "raw_body", "reply_with"]

log = logging.getLogger("ctxfleet.requests")
_M = TypeVar("_M", bound=BaseModel)


async def raw_body(msg: NatsMessage) -> bytes:
    """FastStream decoder that leaves the body as bytes, so bad input gets a typed error reply."""
    return msg.body


def parse_body(model: type[_M], body: bytes) -> _M:
    """Validate a request body; an invalid one is an InvalidRequest naming the field."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        loc = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidRequest(f"invalid {model.__name__}: {loc}: {first['msg']}") from None


def error_reply(exc: Exception) -> ErrorReply:
    """The wire error of any failure; an unexpected one is logged and reported as internal."""
    if isinstance(exc, CtxError):
        return exc.to_reply()
    log.exception("request failed unexpectedly")
    return ErrorReply(code=ErrorCode.INTERNAL, message=f"{type(exc).__name__}: {exc}", retryable=True)


async def reply_with(run: Callable[[], Awaitable[BaseModel]]) -> NatsResponse:
    """Run a request and answer with its model, or with the typed error it raised."""
    try:
        result = await run()
    except Exception as exc:
        return NatsResponse(error_reply(exc).model_dump_json().encode(), headers={"ctx-status": "error"})
    return NatsResponse(result.model_dump_json().encode(), headers={"ctx-status": "ok"})
