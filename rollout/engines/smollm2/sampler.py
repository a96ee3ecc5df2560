"""Deterministic, batch-independent token sampling (rollout-sampler-v2).

The random draw for a sequence at output position t is a counter-based uniform
keyed by (seq_seed, t) alone (splitmix64), never a global RNG. Each row is sampled on
its own from its float32 logits, so what else is in the batch cannot change it.

Candidate order: with top-k or top-p truncation, tokens are ranked by scaled logit
(descending, ties by lower token id), truncated, and the draw inverts the float64
cumulative sum of their float32 probabilities. Without truncation the ranking would
not change the distribution, so the cumulative sum runs in token-id order (no sort).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from rollout.engines.smollm2 import kernels
from rollout.sampling_params import SamplingParams

# v2: exp, its sum and log from the fixed-order kernels (v1 used numpy's, whose SIMD
# variants differ between CPUs)
SAMPLER_VERSION = "rollout-sampler-v2"
_MASK64 = (1 << 64) - 1
_PROBE = 256  # candidates examined before falling back to a full sort


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """A uniform float64 in [0, 1) from (seed, position) alone: 53 random bits."""
    return (splitmix64(splitmix64(seed & _MASK64) ^ (position & _MASK64)) >> 11) * 2.0**-53


@dataclass
class Sampled:
    token_id: int
    logprob: float | None
    top: list[tuple[int, float]] | None


def _ranked(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`ids` ordered by x descending, then token id ascending."""
    return ids[np.lexsort((ids, -x[ids]))]


def _top_candidates(x: np.ndarray, count: int) -> np.ndarray:
    """At least the `count` best tokens (all ties at the boundary included), ranked."""
    if count >= x.shape[0]:
        return _ranked(x, np.arange(x.shape[0]))
    threshold = np.partition(x, x.shape[0] - count)[x.shape[0] - count]
    return _ranked(x, np.flatnonzero(x >= threshold))


class _Scaled:
    """One row's scaled logits with exp(x - max) and its float64 sum, each computed once
    (by the fixed-order kernels): the draw and the logprobs of a token share them."""

    def __init__(self, x: np.ndarray) -> None:
        self.x = x
        self.m = x.max()
        self.probs, self.total = kernels.exp_shifted(x, self.m)  # float32, unnormalised

    @cached_property
    def log_total(self) -> float:
        return kernels.log(self.total)

    def logprobs(self, ids: np.ndarray) -> np.ndarray:
        return ((self.x[ids].astype(np.float64) - float(self.m)) - self.log_total).astype(
            np.float32
        )


def sample_row(
    logits: np.ndarray, params: SamplingParams, seed: int, position: int,
    forced: int | None = None,
) -> Sampled:  # fmt: skip
    """Pick the next token of one sequence from its float32 logits; with `forced` (teacher
    forcing), that token, with the logprobs a draw of it would have recorded."""
    x = logits if params.greedy else logits / np.float32(params.temperature)
    scaled = _Scaled(x) if not params.greedy or params.logprobs or params.top_logprobs else None
    if forced is not None:
        token = forced
    elif scaled is None or params.greedy:
        token = int(np.argmax(x))  # the first (lowest id) of equal maxima
    else:
        token = _draw(scaled, params, uniform(seed, position))
    logprob = float(scaled.logprobs(np.array([token]))[0]) if params.logprobs else None
    top = None
    if params.top_logprobs:
        ids = _top_candidates(x, params.top_logprobs)[: params.top_logprobs]
        top = [(int(i), float(lp)) for i, lp in zip(ids, scaled.logprobs(ids), strict=True)]
    return Sampled(token, logprob, top)


def _draw(scaled: _Scaled, params: SamplingParams, u: float) -> int:
    x, probs = scaled.x, scaled.probs
    vocab = x.shape[0]
    k = vocab if params.top_k == -1 else min(params.top_k, vocab)
    if k == vocab and params.top_p >= 1.0:
        cdf = np.cumsum(probs, dtype=np.float64)
        return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), vocab - 1))
    probe = k if params.top_p >= 1.0 else min(k, _PROBE)
    ids = _top_candidates(x, probe)[:k]
    cdf = np.cumsum(probs[ids], dtype=np.float64)
    if params.top_p < 1.0:
        need = params.top_p * scaled.total
        if cdf[-1] < need and ids.shape[0] < k:
            # The probe did not reach top_p mass: rank the whole vocabulary instead.
            ids = _top_candidates(x, vocab)[:k]
            cdf = np.cumsum(probs[ids], dtype=np.float64)
        cut = int(np.searchsorted(cdf, need, side="left"))
        ids, cdf = ids[: cut + 1], cdf[: cut + 1]
    j = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    return int(ids[min(j, ids.shape[0] - 1)])
