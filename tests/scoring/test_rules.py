"""The rule-based scorers, the json_schema scorer and user scorers, on rows written here."""

from __future__ import annotations

import pytest

from rollout.errors import AccessError, ConfigError
from rollout.scoring.base import ScoreRow
from rollout.scoring.registry import build, check_allowed, scorer_class


def rows(*outputs: str, **columns) -> list[ScoreRow]:
    return [
        ScoreRow(output=o, prompt="p", columns={k: v[i] for k, v in columns.items()},
                 num_output_tokens=len(o.split()))
        for i, o in enumerate(outputs)
    ]  # fmt: skip


def values(name: str, key: str, options: dict, batch: list[ScoreRow]) -> list:
    return [(s.value, s.detail) for s in build(name, key, options).score(batch)]


def test_exact_match_normalises_both_sides_in_the_order_given():
    batch = rows("  The Answer! ", "answer", "no", "x", ref=["answer", "The answer", "yes", None])
    got = values("em", "exact_match", {"reference": "ref"}, batch)
    assert got == [(0.0, None), (0.0, None), (0.0, None), (None, None)]
    squad = ["lower", "remove_punctuation", "remove_articles", "collapse_whitespace"]
    got = values("em", "exact_match", {"reference": "ref", "normalize": squad}, batch)
    assert got == [(1.0, None), (1.0, None), (0.0, None), (None, None)]
    # a list reference: any of its answers
    assert values("em", "exact_match", {"reference": "ref"}, rows("b", ref=[["a", "b"]])) == [(1.0, None)]  # fmt: skip


def test_regex_match_extracts_the_last_match_and_says_what_it_found():
    batch = rows("so 3, no wait: answer 42", "nothing here", "answer 7", ref=["42", "1", None])
    got = values("rx", "regex_match", {"pattern": r"answer (\d+)", "reference": "ref"}, batch)
    assert got == [(1.0, "42"), (0.0, "no match"), (None, "7")]
    got = values("rx", "regex_match", {"pattern": r"(\d+)", "occurrence": "first", "reference": "ref"}, batch[:1])  # fmt: skip
    assert got == [(0.0, "3")]
    with pytest.raises(ConfigError, match=r"scoring\.rx.*pattern.*not a valid regular expression"):
        build("rx", "regex_match", {"pattern": "(", "reference": "ref"})
    with pytest.raises(ConfigError, match=r"scoring\.rx\.group.*2 groups"):
        build("rx", "regex_match", {"pattern": "(a)(b)", "group": 3, "reference": "ref"})


def test_multiple_choice_finds_the_letter_as_harnesses_do():
    outs = [
        "The answer is (C).",
        "Answer: b",
        "(D) because",
        "A. It is",
        "I cannot tell",
        "answer is E",
    ]
    got = values("mc", "multiple_choice", {"reference": "gold"},
                 rows(*outs, gold=["C", "B", 2, "A", "A", "A"]))  # fmt: skip
    assert got == [(1.0, "C"), (1.0, "B"), (0.0, "D"), (1.0, "A"), (0.0, "no choice found"), (0.0, "no choice found")]  # fmt: skip


def test_length_is_dapos_soft_overlong_punishment():
    batch = [ScoreRow(output="", prompt="", columns={}, num_output_tokens=n) for n in (0, 12, 13, 16, 20, 21)]  # fmt: skip
    got = [s.value for s in build("len", "length", {"max_tokens": 20, "buffer": 8}).score(batch)]
    # L_max 20, L_cache 8: 0 up to 12, then (12 - n) / 8 down to -1 at 20, -1 beyond
    assert got == [0.0, 0.0, -0.125, -0.5, -1.0, -1.0]
    with pytest.raises(ConfigError, match="buffer.*at most max_tokens"):
        build("len", "length", {"max_tokens": 4, "buffer": 8})


def test_format_rewards_the_required_shape():
    got = values("fmt", "format", {"pattern": r"<think>.*</think>\s*\S.*", "reward": 0.5},
                 rows("<think>a\nb</think> 42", "42", "<think>x</think>"))  # fmt: skip
    assert got == [(0.5, None), (-1.0, None), (-1.0, None)]


def test_json_schema_parses_validates_and_says_where():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    outs = ['{"n": 3}', '```json\n{"n": 4}\n```', '{"n": "x"}', "{n: 3}", "{}"]
    got = values("js", "json_schema", {"schema": schema}, rows(*outs))
    assert [v for v, _ in got] == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert got[2][1] == "invalid at n: 'x' is not of type 'integer'"
    assert got[3][1].startswith("not JSON: Expecting property name")
    assert got[4][1] == "invalid at (root): 'n' is a required property"
    with pytest.raises(ConfigError, match="not a valid JSON Schema"):
        build("js", "json_schema", {"schema": {"type": "no-such-type"}})


def test_unknown_scorers_and_options_name_the_field():
    with pytest.raises(
        ConfigError, match=r"scoring\.x\.scorer.*unknown scorer 'nope'.*exact_match"
    ):
        build("x", "nope", {})
    with pytest.raises(ConfigError, match=r"scoring\.x\.refrence.*Extra inputs are not permitted"):
        build("x", "exact_match", {"reference": "a", "refrence": "a"})
    with pytest.raises(ConfigError, match=r"scoring\.x\.reference: Field required"):
        build("x", "exact_match", {})


def test_user_scorers_need_the_decorator_and_an_allowed_module():
    key = "tests.scoring.user_scorers:brevity"
    scorer = build("short", key, {"limit": 3})
    assert scorer_class(key, "w").version == "7"
    assert [(s.value, s.detail) for s in scorer.score(rows("a b", "a b c d"))] == [(1.0, "2 words"), (0.0, "4 words")]  # fmt: skip
    with pytest.raises(ConfigError, match=r"scoring\.short\.nope.*takes no option 'nope'"):
        build("short", key, {"nope": 1})
    with pytest.raises(ConfigError, match="is not a rollout scorer: decorate it"):
        build("x", "tests.scoring.user_scorers:undecorated", {})
    with pytest.raises(ConfigError, match="cannot be imported"):
        build("x", "tests.scoring.no_such_module:f", {})
    check_allowed(key, None, "w")  # rollout run: any import path
    check_allowed(key, ("tests.scoring",), "w")  # a parent package allows its modules
    check_allowed("exact_match", (), "w")  # built-ins are always allowed
    with pytest.raises(AccessError, match=r"--allow-scorer: tests\.other"):
        check_allowed(key, ("tests.other",), "scoring.short.scorer")
