"""A typed Python client of berth's HTTP API, sync (`BerthClient`) and async (`AsyncBerthClient`).

It needs msgspec and httpx only, not the server extra: the `berth` command is built on it. Each
method returns the view the server answers with (service/views.py), decoded by type; an error
answer raises `ApiError` (status, error, field), no answer `Unreachable`. docs/client.md has an
example.
"""

from service.client.asynchronous import AsyncBerthClient
from service.client.bodies import InputRequest, JobRequest
from service.client.errors import ApiError, Unreachable
from service.client.sync import BerthClient

__all__ = [
    "ApiError",
    "AsyncBerthClient",
    "BerthClient",
    "InputRequest",
    "JobRequest",
    "Unreachable",
]
