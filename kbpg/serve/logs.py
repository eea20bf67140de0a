"""The server's log: uvicorn's text lines, or one JSON object a line (`--log-format json`)."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

FORMATS = ("text", "json")
# the attributes every LogRecord has; anything else was passed with `extra=` and is logged too
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's message with terminal colours
}


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", ...extra fields}`, one object a line (UTC time)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def log_config(log_format: str) -> dict[str, Any] | None:
    """uvicorn's `log_config` for the format: None keeps uvicorn's own (text)."""
    if log_format == "text":
        return None
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "json",
        "stream": "ext://sys.stderr",
    }
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"stderr": handler},
        "root": {"handlers": ["stderr"], "level": "INFO"},
        # uvicorn's loggers log through the root handler (uvicorn.access stays off: kbpg.http
        # logs each request with its route, status and time)
        "loggers": {
            "uvicorn": {"level": "INFO", "handlers": [], "propagate": True},
            "uvicorn.error": {"level": "INFO", "handlers": [], "propagate": True},
            "uvicorn.access": {"level": "WARNING", "handlers": [], "propagate": True},
        },
    }
