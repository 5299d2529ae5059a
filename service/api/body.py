"""Strict request bodies: unknown fields and wrong types are a 400 naming the field."""

from typing import Any, TypeVar

import msgspec
from litestar import Request

from service.core.errors import Invalid

T = TypeVar("T")

MAX_BODY = 16 * 1024 * 1024


async def decode(request: Request[Any, Any, Any], kind: type[T] | Any) -> T:  # noqa: ANN401
    """Decode the JSON body as `kind`, or raise Invalid with msgspec's pointed message."""
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise Invalid("request body too large")
    if not raw.strip():
        raise Invalid("a JSON body is required")
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:  # e.g. "Object contains unknown field `comand`"
        raise Invalid(f"invalid body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise Invalid(f"malformed JSON: {exc}") from None
