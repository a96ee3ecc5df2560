"""Statistics over the n samples of one example: GRPO's group-relative advantage, and
pass@k with the unbiased estimator of Chen et al. (2021)."""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_EPS = 1e-4  # as TRL's GRPOTrainer adds to the std


def group_stats(values: Sequence[float | None], eps: float) -> tuple[float | None, float | None, list[float | None]]:  # fmt: skip
    """(mean, std, advantages) of one group's scores. The std is the sample standard
    deviation (n - 1 in the denominator, as torch.std and TRL's GRPO compute it; 0 for a
    group of one); advantage = (score - mean) / (std + eps). A null score stays null and
    is left out of the mean and std; a group with no score has null statistics."""
    known = [v for v in values if v is not None]
    if not known:
        return None, None, [None] * len(values)
    mean = math.fsum(known) / len(known)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in known) / (len(known) - 1)) if len(known) > 1 else 0.0  # fmt: skip
    return mean, std, [None if v is None else (v - mean) / (std + eps) for v in values]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c passed:
    1 - C(n - c, k) / C(n, k), computed as a product (Chen et al., 2021, figure 3)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per example, got {n}")
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product
