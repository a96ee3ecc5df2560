"""math_equal, and the word-problem set written for this project checked against GSM8K's
own evaluation code (openai/grade-school-math, grade_school_math/dataset.py, MIT licence,
reproduced below as the independent reference)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rollout.scoring.base import ScoreRow
from rollout.scoring.registry import build

DATA = Path(__file__).parents[2] / "data" / "math" / "word_problems.jsonl"

# --- GSM8K's reference grader, as published (grade_school_math/dataset.py) ---------------
ANS_RE = re.compile(r"#### (\-?[0-9\.\,]+)")
INVALID_ANS = "[invalid]"


def extract_answer(completion):
    match = ANS_RE.search(completion)
    if match:
        match_str = match.group(1).strip()
        match_str = match_str.replace(",", "")
        return match_str
    else:
        return INVALID_ANS


def is_correct(model_completion, gt_example):
    gt_answer = extract_answer(gt_example["answer"])
    assert gt_answer != INVALID_ANS
    return extract_answer(model_completion) == gt_answer


# -----------------------------------------------------------------------------------------


def problems() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines()]


def test_the_sets_answers_agree_with_its_own_calculations():
    """Every <<expr=value>> annotation evaluates to its value, and the last one (or the
    worked answer) is the final '#### N'."""
    for p in problems():
        for expr, value in re.findall(r"<<([^=]+)=([^>]+)>>", p["answer"]):
            assert eval(expr, {"__builtins__": {}}) == pytest.approx(float(value)), (p["id"], expr)  # noqa: S307 - our own data
        assert extract_answer(p["answer"]) != INVALID_ANS


def candidates(p: dict) -> list[str]:
    """Completions of many shapes for one problem: right, wrong, formatted, unformatted."""
    gold = extract_answer(p["answer"])
    wrong = str(int(float(gold)) + 1)
    with_commas = f"{int(float(gold)):,}" if float(gold).is_integer() else gold
    return [
        p["answer"],  # the worked solution itself
        p["answer"].rsplit("####", 1)[0] + f"#### {wrong}",
        f"Let me think. The result is {gold}.\n#### {with_commas}",
        f"The answer is {gold}.",  # no '#### N': GSM8K's strict format says invalid
        f"#### {gold} apples, or maybe #### {wrong}",  # the first '####' counts
        "I do not know.",
    ]


def test_math_equal_in_gsm8k_mode_agrees_with_gsm8ks_grader_on_every_row():
    scorer = build("correct", "math_equal", {"reference": "answer", "extract": "gsm8k", "reference_format": "gsm8k"})  # fmt: skip
    rows, expected = [], []
    for p in problems():
        for c in candidates(p):
            rows.append(ScoreRow(output=c, prompt=p["question"], columns=p))
            expected.append(float(is_correct(c, p)))
    got = [s.value for s in scorer.score(rows)]
    assert got == expected
    assert 0 < sum(got) < len(got)  # both verdicts occur


def test_math_equal_compares_as_mathematics():
    scorer = build("m", "math_equal", {"reference": "ref"})
    cases = [
        ("The answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
        ("so x = 2/4", "\\frac{1}{2}", 1.0),
        ("Final: $\\boxed{\\sqrt{4}}$", "2", 1.0),
        ("Hence $\\boxed{3}$. Check: 2 + 2 = 4", "3", 1.0),  # the boxed answer wins
        ("The total is 1,000 dollars", "1000", 1.0),
        ("$\\boxed{7}$", "8", 0.0),
        ("no idea", "8", 0.0),
    ]
    rows = [ScoreRow(output=o, prompt="", columns={"ref": r}) for o, r, _ in cases]
    assert [s.value for s in scorer.score(rows)] == [e for _, _, e in cases]
    boxed = build("m", "math_equal", {"reference": "ref", "extract": "boxed"})
    got = boxed.score([ScoreRow(output="x = 5, so \\boxed{\\frac{10}{2}}", prompt="", columns={"ref": "5"}),
                       ScoreRow(output="x = 5", prompt="", columns={"ref": "5"})])  # fmt: skip
    assert [(s.value, s.detail) for s in got] == [(1.0, "\\frac{10}{2}"), (0.0, "no answer found")]
    last = build("m", "math_equal", {"reference": "ref", "extract": "last_number"})
    assert [s.value for s in last.score([ScoreRow(output="3 apples and then 12", prompt="", columns={"ref": "12"})])] == [1.0]  # fmt: skip
