"""Strict request bodies: a 400 naming the field for anything unknown, mistyped or out of bounds.

The bounds are where input enters: integers within what the Postgres columns hold, no NUL in
any string (Postgres text cannot hold one, and an environment variable cannot either), lengths
capped. msgspec checks them while decoding, so a body out of bounds never reaches the domain.
"""

from typing import Annotated, Any, TypeVar

import msgspec
from litestar import Request

from service.core.errors import Invalid

T = TypeVar("T")

MAX_BODY = 16 * 1024 * 1024
NO_NUL = r"\A[^\x00]*\Z"
NAME = r"\A[A-Za-z0-9][A-Za-z0-9._-]*\Z"

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=NAME)]
Kind = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=NAME)]
Label = Annotated[
    str, msgspec.Meta(min_length=1, max_length=256, pattern=r"\A[^,\x00-\x1f\x7f]+\Z")
]
Arg = Annotated[str, msgspec.Meta(max_length=128 * 1024, pattern=NO_NUL)]
Source = Annotated[str, msgspec.Meta(max_length=4 * 1024 * 1024, pattern=NO_NUL)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
Seconds = Annotated[float, msgspec.Meta(ge=0, le=366 * 86400)]  # finite: NaN and inf fail


async def decode(request: Request[Any, Any, Any], kind: type[T] | Any) -> T:  # noqa: ANN401
    """Decode the JSON body as `kind`, or raise Invalid with msgspec's pointed message."""
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise Invalid("request body too large")
    if not raw.strip():
        raise Invalid("a JSON body is required")
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:  # e.g. "Expected `int` <= 2147483647 - at `$.priority`"
        raise Invalid(f"invalid body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise Invalid(f"malformed JSON: {exc}") from None
