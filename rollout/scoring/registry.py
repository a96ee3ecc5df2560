"""Scorers by name, imported lazily; user scorers by import path (`module:function`).

A user scorer is a function decorated with `@rollout.scoring.scorer(version=...)`:

    @scorer(version="1")
    def brevity(rows: list[ScoreRow], *, limit: int = 100) -> list[float | Score | None]:
        return [1.0 if len(r.output) <= limit else 0.0 for r in rows]

Its options are the entry's other fields, passed as keyword arguments. The signature is
versioned (`SCORER_API`); the scorer's own `version` goes into `config_hash`, so bump it
whenever its scores could change. `rollout run` imports any such path; `rollout serve`
only those whose module its operator allowed (`--allow-scorer`), so that the service never
runs code that a submitter alone named.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

from rollout.errors import ConfigError
from rollout.scoring.base import Score, Scorer, ScoreRow

SCORER_API = "rollout-scorer-v1"

# name -> "module:Class". Importing this module imports none of them.
SCORERS: dict[str, str] = {
    "exact_match": "rollout.scoring.rules:ExactMatch",
    "regex_match": "rollout.scoring.rules:RegexMatch",
    "multiple_choice": "rollout.scoring.rules:MultipleChoice",
    "length": "rollout.scoring.rules:LengthPenalty",
    "format": "rollout.scoring.rules:FormatPenalty",
    "json_schema": "rollout.scoring.jsonschema:JsonSchema",
    "math_equal": "rollout.scoring.mathx:MathEqual",
    "code_tests": "rollout.scoring.code:CodeTests",
}
_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def scorer(version: str) -> Callable[[Callable], Callable]:
    """Mark a function as a rollout scorer of `version` (see the module docstring)."""

    def mark(fn: Callable) -> Callable:
        fn.__rollout_scorer__ = {"api": SCORER_API, "version": str(version)}  # type: ignore[attr-defined]
        return fn

    return mark


def is_import_path(key: str) -> bool:
    return key not in SCORERS and bool(_IMPORT_PATH.match(key))


def check_allowed(key: str, allowed: Collection[str] | None, where: str) -> None:
    """Refuse a user scorer whose module is not in `allowed` (None: all are)."""
    if not is_import_path(key) or allowed is None:
        return
    module = key.partition(":")[0]
    if not any(module == m or module.startswith(m + ".") for m in allowed):
        from rollout.errors import AccessError

        listed = ", ".join(sorted(allowed)) or "none"
        raise AccessError(where, key, f"this service runs only the user scorers of the modules its operator allowed (--allow-scorer: {listed})")  # fmt: skip


def scorer_class(key: str, where: str) -> type[Scorer]:
    """The scorer registered as `key`, or a user scorer at the import path `key`."""
    target = SCORERS.get(key)
    if target is not None:
        module_name, _, class_name = target.partition(":")
        return getattr(importlib.import_module(module_name), class_name)
    if not _IMPORT_PATH.match(key):
        valid = ", ".join(sorted(SCORERS))
        raise ConfigError(where, key, f"unknown scorer {key!r}; built-in scorers: {valid}; or a user scorer as module:function")  # fmt: skip
    module_name, _, attr = key.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(where, key, f"cannot be imported: {exc}") from None
    mark = getattr(fn, "__rollout_scorer__", None)
    if not isinstance(mark, dict) or mark.get("api") != SCORER_API:
        raise ConfigError(where, key, f"is not a rollout scorer: decorate it with @rollout.scoring.scorer(version=...) ({SCORER_API})")  # fmt: skip
    return _function_scorer(key, fn, mark["version"])


def _function_scorer(key: str, fn: Callable, version: str) -> type[Scorer]:
    params = inspect.signature(fn).parameters

    class FunctionScorer(Scorer):
        has_detail = True

        def __init__(self, name: str, options: dict[str, Any]) -> None:
            self.name = name
            unknown = [k for k in options if k not in params or k == next(iter(params))]
            if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
                raise ConfigError(f"scoring.{name}.{unknown[0]}", options[unknown[0]], f"{key} takes no option {unknown[0]!r}")  # fmt: skip
            self.options = dict(options)

        def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
            out = fn(list(rows), **self.options)
            if len(out) != len(rows):
                raise ConfigError(f"scoring.{self.name}", key, f"returned {len(out)} scores for {len(rows)} rows")  # fmt: skip
            return [_as_score(v, key) for v in out]

    FunctionScorer.key, FunctionScorer.version = key, version
    return FunctionScorer


def _as_score(value: Any, key: str) -> Score:
    if isinstance(value, Score):
        return value
    if value is None:
        return Score(None)
    if isinstance(value, tuple) and len(value) == 2:
        return Score(None if value[0] is None else float(value[0]), None if value[1] is None else str(value[1]))  # fmt: skip
    if isinstance(value, bool | int | float):
        return Score(float(value))
    raise ConfigError("scoring", key, f"returned {type(value).__name__}, not a float, a (float, detail) pair, a Score or None")  # fmt: skip


def build(name: str, key: str, options: dict[str, Any]) -> Scorer:
    """The scorer of one `scoring:` entry, its options checked."""
    return scorer_class(key, f"scoring.{name}.scorer")(name, options)
