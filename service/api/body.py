"""Strict request bodies: a 400 naming the field for anything unknown, mistyped or out of bounds.

A handler declares its body as `data: SomeBody` (a msgspec Struct); the Struct is the one
declaration of its bounds: integers within what the Postgres columns hold, no NUL in any
string (Postgres text cannot hold one, and an environment variable cannot either), lengths
capped. The same Struct is the body's schema in the OpenAPI document.

Litestar's own decoding converts leniently (`"3"` would pass for 3), so `StrictRequest.json`
converts the body with msgspec, strictly, into the handler's declared type: a body out of
bounds never reaches the domain, and the answer names the field at fault. A number written
with a fraction that is whole (`3.0`) is an integer, as JSON Schema has it.
"""

import re
from typing import Annotated, Any

import msgspec
from litestar import Request
from litestar.exceptions import ValidationException

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

# A name in a path or query (a tenant, secret or token): the bounds of `Name`, for Litestar.
NAME_PARAM: dict[str, Any] = {"min_length": 1, "max_length": 128, "pattern": NAME}

BODY_REQUIRED = "a JSON body is required"
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`\Z")
_UNKNOWN = re.compile(r"unknown field `(?P<name>[^`]*)`")


def field_of(message: str) -> str | None:
    """The field a msgspec message points at: `max_attempts`, `inputs[0].sha256`; None: the body.

    An unknown field is named itself (`comand`), since that is what the sender must fix.
    """
    at = _AT.search(message)
    path = at["path"].removeprefix(".") if at else ""
    if unknown := _UNKNOWN.search(message):
        path = f"{path}.{unknown['name']}" if path else unknown["name"]
    return path or None


def invalid(message: str, field: str | None) -> ValidationException:
    """The one shape of a refused body (api/errors.py answers it as ErrorView)."""
    return ValidationException(message, extra=[{"message": message, "key": field or ""}])


def _number(text: str) -> int | float:
    """A JSON number with a fraction or exponent: an int when it is one (`3.0`, `1e2`).

    JSON Schema counts 3.0 as an integer, so a client may send it for one; anything else
    stays a float (and fails an integer field, naming it).
    """
    value = float(text)
    return int(value) if value.is_integer() else value


_JSON = msgspec.json.Decoder(float_hook=_number)


class StrictRequest(Request[Any, Any, Any]):
    """The app's request class: JSON bodies decode strictly into the handler's `data` type."""

    async def json(self) -> Any:  # noqa: ANN401  (the handler's declared body type)
        declared = self.route_handler.parsed_data_field
        if declared is None:
            return await super().json()
        raw = await self.body()
        if not raw.strip():
            if declared.is_optional:  # a body the handler may go without (an answer's reason)
                return None
            raise invalid(BODY_REQUIRED, None)
        try:
            parsed = _JSON.decode(raw)
        except msgspec.DecodeError as exc:
            raise invalid(f"malformed JSON: {exc}", None) from None
        try:  # strict: "3" is no number, and nothing unknown or out of bounds passes
            return msgspec.convert(parsed, declared.annotation, strict=True)
        except msgspec.ValidationError as exc:  # "Expected `int` <= 2147483647 - at `$.priority`"
            raise invalid(f"invalid body: {exc}", field_of(str(exc))) from None
