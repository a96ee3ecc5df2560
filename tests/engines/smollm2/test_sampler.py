"""The deterministic sampler: counter-based draws, exact truncation rules, real distributions."""

from __future__ import annotations

import numpy as np
import pytest

from rollout.engines.smollm2.sampler import sample_row, splitmix64, uniform
from rollout.sampling_params import SamplingParams


def test_splitmix64_reference_values():
    # The first outputs of the reference splitmix64 stream seeded with 0 (Vigna's
    # splitmix64.c): state advances by the golden gamma, each output is mix(state).
    assert splitmix64(0) == 0xE220A8397B1DCDAF
    assert splitmix64(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4


def test_uniform_depends_on_seed_and_position_only():
    a = [uniform(123, t) for t in range(1000)]
    assert a == [uniform(123, t) for t in range(1000)]
    assert all(0.0 <= u < 1.0 for u in a)
    assert a != [uniform(124, t) for t in range(1000)]
    assert len(set(a)) == 1000
    assert abs(np.mean(a) - 0.5) < 0.03


def reference_draw(x: np.ndarray, p: SamplingParams, u: float) -> int:
    """The rule of rollout-sampler-v1, written plainly: rank everything, truncate, invert."""
    probs = np.exp(x - x.max())
    if p.top_k == -1 and p.top_p >= 1.0:
        order = np.arange(x.shape[0])
    else:
        order = np.array(sorted(range(x.shape[0]), key=lambda i: (-x[i], i)))
        if p.top_k != -1:
            order = order[: p.top_k]
    cdf = np.cumsum(probs[order], dtype=np.float64)
    if p.top_p < 1.0:
        need = p.top_p * probs.sum(dtype=np.float64)
        keep = next((i + 1 for i, c in enumerate(cdf) if c >= need), len(cdf))
        order, cdf = order[:keep], cdf[:keep]
    j = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return int(order[min(j, len(order) - 1)])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_p=0.95),
        SamplingParams(temperature=1.3, top_p=0.999),  # needs more than the probe
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.0, top_k=400),  # more than the probe
        SamplingParams(temperature=1.0, top_k=50, top_p=0.5),
        SamplingParams(temperature=2.0),
    ],
)
def test_sampler_matches_the_plain_rule(params: SamplingParams):
    rng = np.random.default_rng(7)
    for trial in range(40):
        logits = (rng.standard_normal(3000) * 3).astype(np.float32)
        logits[rng.integers(0, 3000, 20)] = logits.max()  # ties at the top
        x = logits / np.float32(params.temperature)
        got = sample_row(logits, params, seed=99, position=trial).token_id
        assert got == reference_draw(x, params, uniform(99, trial))


def test_greedy_takes_lowest_id_among_equal_maxima():
    logits = np.zeros(10, dtype=np.float32)
    logits[[3, 7]] = 5.0
    out = sample_row(logits, SamplingParams(temperature=0, logprobs=True), seed=1, position=0)
    assert out.token_id == 3
    assert out.logprob == pytest.approx(np.log(np.exp(5) / (2 * np.exp(5) + 8)), rel=1e-6)


def test_top_k_1_and_tiny_top_p_are_greedy():
    rng = np.random.default_rng(3)
    for t in range(20):
        logits = rng.standard_normal(500).astype(np.float32)
        best = int(np.argmax(logits))
        assert sample_row(logits, SamplingParams(top_k=1), 5, t).token_id == best
        assert sample_row(logits, SamplingParams(top_p=1e-6), 5, t).token_id == best


def test_sampled_frequencies_follow_the_distribution():
    probs = np.array([0.5, 0.25, 0.15, 0.1], dtype=np.float64)
    logits = np.log(probs).astype(np.float32)
    n = 20000
    counts = np.bincount(
        [sample_row(logits, SamplingParams(), 42, t).token_id for t in range(n)], minlength=4
    )
    assert np.all(np.abs(counts / n - probs) < 0.015), counts / n
    # top_p=0.8 keeps {0, 1, 2} (0.5 + 0.25 < 0.8 <= 0.9), renormalised.
    kept = np.bincount(
        [sample_row(logits, SamplingParams(top_p=0.8), 42, t).token_id for t in range(n)],
        minlength=4,
    )
    assert kept[3] == 0
    assert np.all(np.abs(kept[:3] / n - probs[:3] / 0.9) < 0.015), kept / n


def test_top_logprobs_are_ranked_and_normalised():
    logits = np.array([1.0, 3.0, 2.0, 3.0, -1.0], dtype=np.float32)
    out = sample_row(logits, SamplingParams(temperature=0, top_logprobs=3, logprobs=True), 0, 0)
    assert [i for i, _ in out.top] == [1, 3, 2]
    full = logits - np.log(np.exp(logits.astype(np.float64)).sum())
    assert [lp for _, lp in out.top] == pytest.approx(full[[1, 3, 2]], rel=1e-6)
    assert out.token_id == 1 and out.logprob == pytest.approx(full[1], rel=1e-6)
