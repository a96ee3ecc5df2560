"""What a scorer is: rows in (a generation and its input columns), one score per row out.

A scorer is a class with a `key` (its registry name), a `version` (bumped whenever its
scores could change: it goes into `config_hash`) and an `Options` model (pydantic,
`extra="forbid"`) for the options of a `scoring:` entry. Scores are deterministic
functions of the row: no clock, no randomness, no network.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rollout.errors import ConfigError, config_error_from_validation


@dataclass(frozen=True)
class ScoreRow:
    """One output row as a scorer sees it."""

    output: str  # the generated (or given) completion's text
    prompt: str  # the prompt text fed to the engine (chat template applied)
    columns: dict[str, Any]  # the input row's columns
    finish_reason: str = "stop"
    num_output_tokens: int = 0
    example_id: str = ""
    sample_index: int = 0


@dataclass(frozen=True)
class Score:
    """A row's score (None: it could not be scored, e.g. a null reference) and a detail."""

    value: float | None
    detail: str | None = None


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Scorer(ABC):
    """A rule that scores rows. Subclasses set key, version, Options and `score`."""

    key: ClassVar[str] = ""
    version: ClassVar[str] = "1"
    Options: ClassVar[type[BaseModel]] = NoOptions
    has_detail: ClassVar[bool] = False  # writes score_<name>_detail

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        self.name = name
        try:
            self.options: Any = self.Options(**options)
        except ValidationError as exc:
            raise config_error_from_validation(exc, prefix=f"scoring.{name}") from None

    def columns(self) -> list[str]:
        """The input columns this scorer reads (checked against the input before the job runs)."""
        return []

    @abstractmethod
    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        """One Score per row, in order."""

    def close(self) -> None:  # noqa: B027 - scorers without resources need not override
        """Release what the scorer holds (worker processes)."""

    def reference(self, row: ScoreRow, column: str) -> Any:
        if column not in row.columns:
            raise ConfigError(f"scoring.{self.name}", column, f"the input has no column {column!r}")  # fmt: skip
        return row.columns[column]
