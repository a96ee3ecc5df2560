"""Rule-based scorers: exact_match, regex_match, multiple_choice, length and format."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollout.scoring.base import Score, Scorer, ScoreRow

Normalize = Literal[
    "strip", "lower", "collapse_whitespace", "remove_punctuation", "remove_articles"
]
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.IGNORECASE)
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize(text: str, steps: Sequence[str]) -> str:
    """`text` after the steps, in the order given (SQuAD's normalisation is lower,
    remove_punctuation, remove_articles, collapse_whitespace)."""
    for step in steps:
        if step == "strip":
            text = text.strip()
        elif step == "lower":
            text = text.lower()
        elif step == "collapse_whitespace":
            text = " ".join(text.split())
        elif step == "remove_punctuation":
            text = text.translate(_PUNCT)
        elif step == "remove_articles":
            text = _ARTICLES.sub(" ", text)
    return text


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _references(value: Any) -> list[str] | None:
    """A reference cell as the list of accepted answers (a list column: any of them)."""
    if value is None:
        return None
    if isinstance(value, list | tuple):
        return [str(v) for v in value if v is not None]
    return [str(value)]


class ExactMatchOptions(_Options):
    reference: str = Field(
        description="The column holding the reference answer (a list: any of them)."
    )
    normalize: list[Normalize] = Field(
        ["strip"], description="Steps applied to both sides, in order."
    )


class ExactMatch(Scorer):
    """1 when the normalised output equals a normalised reference, else 0."""

    key, version, Options = "exact_match", "1", ExactMatchOptions

    def columns(self) -> list[str]:
        return [self.options.reference]

    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        steps = self.options.normalize
        out = []
        for row in rows:
            refs = _references(self.reference(row, self.options.reference))
            if refs is None:
                out.append(Score(None))
                continue
            got = normalize(row.output, steps)
            out.append(Score(float(any(got == normalize(r, steps) for r in refs))))
        return out


class RegexMatchOptions(_Options):
    pattern: str = Field(
        description="A Python regular expression that extracts the answer from the output."
    )
    group: int | str = Field(1, description="The group holding the answer (0: the whole match).")
    occurrence: Literal["first", "last"] = Field(
        "last", description="Which match to take when there are several."
    )
    reference: str = Field(
        description="The column holding the reference answer (a list: any of them)."
    )
    normalize: list[Normalize] = Field(
        ["strip"], description="Steps applied to the extracted text and the reference."
    )
    ignore_case: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"is not a valid regular expression: {exc}") from None
        return v


class RegexMatch(Scorer):
    """Extract with a pattern, compare with the reference: 1 or 0; the detail is what was extracted."""

    key, version, Options, has_detail = "regex_match", "1", RegexMatchOptions, True

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        super().__init__(name, options)
        o = self.options
        self._re = re.compile(o.pattern, re.IGNORECASE if o.ignore_case else 0)
        if isinstance(o.group, int) and o.group > self._re.groups:
            from rollout.errors import ConfigError

            raise ConfigError(f"scoring.{name}.group", o.group, f"the pattern has {self._re.groups} groups")  # fmt: skip

    def columns(self) -> list[str]:
        return [self.options.reference]

    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        o = self.options
        out = []
        for row in rows:
            refs = _references(self.reference(row, o.reference))
            matches = list(self._re.finditer(row.output))
            if not matches:
                out.append(Score(None if refs is None else 0.0, "no match"))
                continue
            match = matches[-1] if o.occurrence == "last" else matches[0]
            got = normalize(match.group(o.group) or "", o.normalize)
            if refs is None:
                out.append(Score(None, got))
                continue
            out.append(Score(float(any(got == normalize(r, o.normalize) for r in refs)), got))
        return out


class MultipleChoiceOptions(_Options):
    reference: str = Field(
        description="The column holding the right choice: a letter, or its 0-based index."
    )
    choices: str = Field(
        "ABCD", min_length=2, max_length=26, description="The choice letters, in order."
    )


class MultipleChoice(Scorer):
    """The letter the output picks, found the way common eval harnesses look for it:
    "Answer: X" / "answer is (X)" first, then "(X)", then a letter alone at the start;
    1 when it is the reference's letter. The detail is the letter found."""

    key, version, Options, has_detail = "multiple_choice", "1", MultipleChoiceOptions, True

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        super().__init__(name, options)
        letters = re.escape(self.options.choices)
        self._patterns = [
            re.compile(rf"(?i)answer\s*(?:is|:)?\s*:?\s*\(?([{letters}])\)?(?![\w])"),
            re.compile(rf"\(([{letters}])\)"),
            re.compile(rf"^\s*([{letters}])(?:[.):\s]|$)"),
        ]

    def columns(self) -> list[str]:
        return [self.options.reference]

    def pick(self, text: str) -> str | None:
        for pattern in self._patterns:
            found = pattern.findall(text)
            if found:
                return found[0].upper()
        return None

    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        choices = self.options.choices
        out = []
        for row in rows:
            ref = self.reference(row, self.options.reference)
            if isinstance(ref, int) and 0 <= ref < len(choices):
                ref = choices[ref]
            picked = self.pick(row.output)
            if ref is None:
                out.append(Score(None, picked))
                continue
            out.append(
                Score(float(picked == str(ref).strip().upper()), picked or "no choice found")
            )
        return out


class LengthOptions(_Options):
    max_tokens: int = Field(
        ge=1, description="L_max: outputs longer than this get the full penalty."
    )
    buffer: int = Field(
        ge=1,
        description="L_cache: the last `buffer` tokens before max_tokens are penalised linearly.",
    )

    @field_validator("buffer")
    @classmethod
    def _fits(cls, v: int, info) -> int:
        if "max_tokens" in info.data and v > info.data["max_tokens"]:
            raise ValueError(f"must be at most max_tokens ({info.data['max_tokens']}), got {v}")
        return v


class LengthPenalty(Scorer):
    """DAPO's soft overlong punishment (Yu et al., 2025): 0 up to max_tokens - buffer output
    tokens, then falling linearly to -1 at max_tokens, and -1 beyond."""

    key, version, Options = "length", "1", LengthOptions

    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        top, buffer = self.options.max_tokens, self.options.buffer
        out = []
        for row in rows:
            n = row.num_output_tokens
            if n <= top - buffer:
                out.append(Score(0.0))
            elif n <= top:
                out.append(Score(((top - buffer) - n) / buffer))
            else:
                out.append(Score(-1.0))
        return out


class FormatOptions(_Options):
    pattern: str = Field(
        description="A regular expression the whole output must match (re.fullmatch, DOTALL)."
    )
    reward: float = Field(0.0, description="The score of an output that matches.")
    penalty: float = Field(-1.0, description="The score of an output that does not.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        return RegexMatchOptions._compiles(v)


class FormatPenalty(Scorer):
    """`reward` when the output has the required form, `penalty` when it does not."""

    key, version, Options = "format", "1", FormatOptions

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        super().__init__(name, options)
        self._re = re.compile(self.options.pattern, re.DOTALL)

    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        o = self.options
        return [Score(o.reward if self._re.fullmatch(r.output) else o.penalty) for r in rows]
