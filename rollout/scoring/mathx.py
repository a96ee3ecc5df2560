"""math_equal: the output's final answer equals the reference, as mathematics.

Parsing and comparison are Hugging Face's Math-Verify (`math-verify`): numbers, fractions,
LaTeX (`\\frac`, `\\sqrt`, sets, intervals), `\\boxed{}` answers, equations and units.
Its timeouts are switched off (they use signals, which work only in a main thread, and a
timeout would make a score depend on the machine's load); inputs are bounded instead.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollout.scoring.base import Score, Scorer, ScoreRow

# GSM8K's own answer format and extraction (openai/grade-school-math, dataset.py)
GSM8K_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
MAX_CHARS = 20_000  # of an output or a reference parsed (the tail is kept: answers come last)


class MathEqualOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reference: str = Field(description="The column holding the reference answer.")
    extract: Literal["auto", "boxed", "gsm8k", "last_number"] = Field(
        "auto",
        description="How the output's answer is found: auto (Math-Verify's extraction: the last "
        "\\boxed{} first, then LaTeX and plain expressions), boxed (only \\boxed{}), gsm8k (only "
        "'#### N', GSM8K's strict format), last_number (the last number in the text).",
    )
    reference_format: Literal["answer", "gsm8k"] = Field(
        "answer",
        description="answer: the column holds the answer; gsm8k: a GSM8K solution ending in '#### N'.",
    )


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


class MathEqual(Scorer):
    """1 when the answer found in the output equals the reference mathematically, else 0;
    the detail is the answer found (or why none was)."""

    key, version, Options, has_detail = "math_equal", "1", MathEqualOptions, True

    def __init__(self, name: str, options: dict[str, Any]) -> None:
        super().__init__(name, options)
        logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" notes

    def columns(self) -> list[str]:
        return [self.options.reference]

    def _answer(self, text: str) -> str | None:
        text = text[-MAX_CHARS:]
        how = self.options.extract
        if how == "gsm8k":
            found = GSM8K_ANSWER.search(text)
            return found.group(1).strip().replace(",", "") if found else None
        if how == "last_number":
            found = _NUMBER.findall(text)
            return found[-1].replace(",", "") if found else None
        if how == "boxed":
            return _last_boxed(text)
        return text

    def score(self, rows: Sequence[ScoreRow]) -> list[Score]:
        from math_verify import parse, verify

        out = []
        for row in rows:
            ref = self.reference(row, self.options.reference)
            if ref is None:
                out.append(Score(None, "no reference"))
                continue
            ref = str(ref)[-MAX_CHARS:]
            if self.options.reference_format == "gsm8k":
                found = GSM8K_ANSWER.search(ref)
                if found is None:
                    out.append(Score(None, "the reference has no '#### N' answer"))
                    continue
                ref = found.group(1).strip().replace(",", "")
            answer = self._answer(row.output)
            if answer is None:
                out.append(Score(0.0, "no answer found"))
                continue
            gold = parse(ref, parsing_timeout=None)
            got = parse(answer, parsing_timeout=None)
            if not got:
                out.append(Score(0.0, "no answer found"))
                continue
            equal = bool(gold) and verify(gold, got, timeout_seconds=None)
            out.append(Score(float(equal), str(got[-1])[:200]))
        return out
