"""What a call raises: the server's answer as `ApiError`, or `Unreachable` when none came.

Both are `service.core.errors.BerthError`s, so `except BerthError` catches either and `.message`
is the line to show a person.
"""

import httpx
import msgspec

from service.core.errors import BerthError, Unavailable
from service.views import ErrorView

_ERROR = msgspec.json.Decoder(ErrorView)


class ApiError(BerthError):
    """The server answered with an error: its `status`, its `error` text and the `field` at fault.

    Decoded from the one error shape every route answers with (`service.views.ErrorView`); a
    body that is not that shape (a proxy's HTML page) leaves `error` as `HTTP <status>`.
    """

    def __init__(self, status: int, error: str, field: str | None = None) -> None:
        super().__init__(error, field=field)
        self.status = status
        self.error = error

    def __repr__(self) -> str:
        return f"ApiError(status={self.status}, error={self.error!r}, field={self.field!r})"


class Unreachable(Unavailable):
    """No answer: the connection failed, timed out, or broke off mid-answer (`lost`)."""

    def __init__(self, message: str, *, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


def error_of(response: httpx.Response) -> ApiError:
    """The ApiError an error response carries (its body must have been read)."""
    try:
        view = _ERROR.decode(response.content)
    except msgspec.DecodeError:  # (ValidationError is one too) not berth's shape: say the status
        return ApiError(response.status_code, f"HTTP {response.status_code}")
    return ApiError(response.status_code, view.error or f"HTTP {view.status}", view.field)
