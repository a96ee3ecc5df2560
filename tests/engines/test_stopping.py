"""Ending sequences: EOS, stop token ids, stop strings, max tokens."""

from __future__ import annotations

from collections.abc import Sequence

from rollout.engines.stopping import StopState
from rollout.sampling_params import SamplingParams

ALPHABET = "abcdefghijklmnopqrstuvwxyz "


def decode(ids: Sequence[int]) -> str:
    return "".join(ALPHABET[i] for i in ids if i < len(ALPHABET))


def feed(state: StopState, text: str) -> int:
    for n, ch in enumerate(text, 1):
        if state.append(ALPHABET.index(ch)):
            return n
    return len(text)


def make(**kw) -> StopState:
    return StopState(SamplingParams(max_tokens=50, **kw), frozenset({99}), 50, decode)


def test_stop_string_cuts_text_and_keeps_tokens():
    s = make(stop=["lo w"])
    assert feed(s, "hello world") == 7  # "hello w" completes the stop string
    assert s.finish_reason == "stop"
    assert s.output_text() == "hel"
    assert len(s.token_ids) == 7


def test_stop_string_kept_when_asked_and_earliest_wins():
    s = make(stop=["world", "lo"], include_stop_str_in_output=True)
    feed(s, "hello world")
    assert s.output_text() == "hello"


def test_eos_and_stop_tokens_and_ignore_eos():
    s = make()
    assert s.append(1) is False and s.append(99) is True and s.finish_reason == "stop"
    s = make(ignore_eos=True, stop_token_ids=[7])
    assert s.append(99) is False
    assert s.append(7) is True and s.finish_reason == "stop" and s.token_ids == [99, 7]


def test_length_limit():
    s = StopState(SamplingParams(max_tokens=3), frozenset(), 3, decode)
    assert [s.append(0), s.append(0), s.append(0)] == [False, False, True]
    assert s.finish_reason == "length" and s.output_text() == "aaa"
