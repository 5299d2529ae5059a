"""Logging with the standard library alone, for what runs without structlog (the worker).

Console lines for people or one JSON object a line (the keys structlog's JSON has: timestamp,
level, logger, event), and the HTTP client's line per request kept at DEBUG: a worker that
talks to its store all day must not fill its log with them.
"""

import datetime as dt
import json
import logging
import sys
from typing import Any

HTTP_CLIENT_LOGGERS = ("httpx", "httpcore")


class HttpClientAtDebug(logging.Filter):
    """httpx logs every request at INFO: shown as DEBUG, and only when DEBUG is on."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and record.levelno < logging.WARNING:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(record.levelno)


def quiet_http_client() -> None:
    for name in HTTP_CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, HttpClientAtDebug) for f in logger.filters):
            logger.addFilter(HttpClientAtDebug())


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "info", *, json_lines: bool | None = None) -> None:
    """Root logging to stderr: console lines on a terminal, JSON lines otherwise (or as asked)."""
    as_json = (not sys.stderr.isatty()) if json_lines is None else json_lines
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLines() if as_json else logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet_http_client()
