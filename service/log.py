"""structlog setup: JSON lines off a terminal (production), readable lines on one.

Context (worker, job, epoch, caller, request_id) is bound with contextvars and merged into
every event. A redaction processor runs last: keys that can carry secrets are dropped, so a
careless `log.info(..., env=env)` cannot leak one.
"""

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from service import stdlog

REDACTED_KEYS = frozenset({"token", "authorization", "secret", "secrets", "env", "password"})


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:  # noqa: ANN401
    for key in list(event):
        if key.lower() in REDACTED_KEYS or key.lower().startswith("secret"):
            event[key] = "***"
    return event


def configure(level: str = "info", *, json: bool | None = None) -> None:
    """Configure structlog and route stdlib logging (uvicorn, the worker) through it."""
    as_json = (not sys.stderr.isatty()) if json is None else json
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
    stdlog.quiet_http_client()
