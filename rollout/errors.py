"""Error types. Every error a user can cause names the parameter or file and the bad value."""

from __future__ import annotations

from typing import Any


class RolloutError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(RolloutError):
    """A parameter of a job, a config or a request is invalid.

    `reason` says what is wrong and shows the value, e.g. "must be in (0, 1], got 1.5".
    """

    def __init__(self, parameter: str, value: Any, reason: str) -> None:
        self.parameter = parameter
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {parameter}: {reason}")

    def __reduce__(self):  # keep the fields when the error crosses a process boundary
        return (type(self), (self.parameter, self.value, self.reason))


class InputError(RolloutError):
    """An input (a prompt, a file, a row) is invalid; `where` names it."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        return (type(self), (self.where, self.reason))


class OutputError(InputError):
    """The run's output could not be written (disk full, read-only, gone): `where` names it."""


class EngineError(RolloutError):
    """The engine cannot start or failed: fatal, never swallowed."""


class RowError(EngineError):
    """One request (one output row) failed in the engine while the others went on: the
    engine rejected or stopped it. Carries the request id and the reason."""

    def __init__(self, request_id: str, reason: str, detail: str) -> None:
        self.request_id, self.reason, self.detail = request_id, reason, detail
        super().__init__(f"request {request_id!r}: {detail} (finish reason {reason!r})")


class EngineLost(EngineError):
    """The engine can no longer serve (a rank of a multi-process replica died): the actor
    holding it must be replaced, and its work retried elsewhere."""


class ClusterLost(RolloutError):
    """The Ray runtime cannot be reached (never was, or went away mid-job). Complete shards
    are kept: rerunning (or resubmitting) the job once Ray is back resumes it."""


class JobCancelled(RolloutError):
    """A job was cancelled while it ran; its complete shards are kept."""


class Conflict(RolloutError):
    """A request names something that exists with other contents (a request_id reused with
    another spec)."""


def shorten(value: object, limit: int = 120) -> str:
    """A value as echoed in an error: its repr, cut in the middle past `limit` characters."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}...({len(text) - limit} characters)...{text[-limit // 2 :]}"


class AccessError(RolloutError):
    """A path lies outside the roots the service may read or write."""

    def __init__(self, parameter: str, path: str, reason: str) -> None:
        self.parameter = parameter
        self.path = path
        self.reason = reason
        super().__init__(f"{parameter} {shorten(path)}: {reason}")

    def __reduce__(self):
        return (type(self), (self.parameter, self.path, self.reason))


def config_error_from_validation(exc: Exception, prefix: str = "") -> ConfigError:
    """The first problem of a pydantic ValidationError as a ConfigError naming the field path."""
    errors = exc.errors() if hasattr(exc, "errors") else []
    if not errors:
        return ConfigError(prefix or "config", None, str(exc))
    first = errors[0]
    path = ".".join(str(p) for p in first.get("loc", ()))
    parameter = ".".join(p for p in (prefix, path) if p) or "config"
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return ConfigError(parameter, first.get("input"), message + more)


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (Ray's errors carry whole tracebacks), or its type."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
