"""berth's error types. The API maps each BerthError to one HTTP status, once (api/errors.py).

A BerthError's message is shown to the caller as is, so it names the problem and never an
internal detail (a query, a stack, another tenant's data).

`EXPECTED` names the failures a loop or side task retries with a warning (the database
restarting or unreachable, a provider refusing); anything else is a bug, logged with its
traceback, and a loop that keeps hitting it stops the server (docs/architecture.md, Errors).
"""


class BerthError(Exception):
    """Base of every error berth raises on purpose; anything else is a bug."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Invalid(BerthError):
    """The input is malformed or names something that cannot be."""

    status = 400


class Unauthenticated(BerthError):
    """No credential, or one that is unknown, revoked or expired."""

    status = 401


class Forbidden(BerthError):
    """The caller is known but may not do this."""

    status = 403


class NotFound(BerthError):
    """The target does not exist, or is not visible to this caller (same answer on purpose)."""

    status = 404


class Conflict(BerthError):
    """The target exists but is in a state that forbids the change."""

    status = 409


class StaleEpoch(Conflict):
    """A worker reported under a lease that is no longer the live one: refuse, kill the copy."""


class Unavailable(BerthError):
    """A dependency (the database) is not there right now; the caller may retry."""

    status = 503


class TooLarge(BerthError):
    """A body over a size bound ([cas] max_blob_gb): refused before it is stored."""

    status = 413


class OverBound(BerthError):
    """A bound that protects every tenant from one (SPEC section 8) would be passed."""

    status = 429


class ProviderError(Exception):
    """A provider could not do what was asked; the message says why (shown in `pool list`)."""


# The failures that are part of normal life: retried with a warning, never fatal. The database
# layer translates every driver error meaning "not reachable now" into Unavailable, so no
# driver type is needed here.
EXPECTED: tuple[type[Exception], ...] = (Unavailable, ProviderError)
