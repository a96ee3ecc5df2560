"""Logging: every diagnostic message of rollout goes through `logging` (a logger per module,
`logging.getLogger(__name__)`), with one format, set up once per process by `setup`.

`rollout --log-level LEVEL --log-format text|json COMMAND`: text lines
`2026-12-01T08:03:43 INFO rollout.runtime.pool: ...`, or one JSON object per line (time,
level, logger, message, and the exception when there is one) for log collectors. Engine
actors (other processes) log the same way: the settings travel in ROLLOUT_LOG_LEVEL and
ROLLOUT_LOG_FORMAT, which `setup` sets and the actors' environment carries.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

LEVEL_ENV, FORMAT_ENV = "ROLLOUT_LOG_LEVEL", "ROLLOUT_LOG_FORMAT"
TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",  # fmt: skip
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, ensure_ascii=False)


def setup(level: str | None = None, fmt: str | None = None) -> None:
    """Send rollout's logs to stderr at `level` in `fmt` (default: the environment's, else
    INFO and text); idempotent."""
    level = (level or os.environ.get(LEVEL_ENV) or "INFO").upper()
    fmt = (fmt or os.environ.get(FORMAT_ENV) or "text").lower()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        from rollout.errors import ConfigError

        raise ConfigError("--log-level", level, "must be one of debug, info, warning, error, critical")  # fmt: skip
    if fmt not in ("text", "json"):
        from rollout.errors import ConfigError

        raise ConfigError("--log-format", fmt, "must be text or json")
    os.environ[LEVEL_ENV], os.environ[FORMAT_ENV] = level, fmt  # for child processes
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT, "%Y-%m-%dT%H:%M:%S"))  # fmt: skip
    root = logging.getLogger("rollout")
    root.handlers = [handler]
    root.setLevel(level)
    root.propagate = False
