"""The fixed-order kernels: right to float precision, and the same bits however they are called.

"The same bits" is checked across row counts and positions, thread counts, and the three
implementations of each kernel: AVX2 intrinsics, the portable C as compiled for a CPU
with FMA (what ROLLOUT_KERNELS=generic runs here), and the portable C built alone, with
fmaf from the C library (what a CPU without AVX2 or FMA runs).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rollout.engines.smollm2 import kernels
from rollout.errors import EngineError

PORTABLE_ONLY = ("-DROLLOUT_PORTABLE_ONLY",)
SHAPES = [(1, 576, 960), (5, 576, 3), (17, 1536, 576), (130, 37, 11), (70, 8, 1), (3, 7, 100)]


def implementations(fn):
    """fn() under each implementation this machine can run, as {name: result}."""
    out = {}
    if kernels.simd():
        out["avx2"] = fn()
    with kernels.using_build(()):
        import os

        os.environ["ROLLOUT_KERNELS"] = "generic"
        kernels._simd.cache_clear()
        try:
            out["portable (cloned for FMA)"] = fn()
        finally:
            del os.environ["ROLLOUT_KERNELS"]
            kernels._simd.cache_clear()
    with kernels.using_build(PORTABLE_ONLY):
        assert kernels.simd() == 0
        out["portable (C library fmaf)"] = fn()
    return out


def assert_all_bitwise_equal(results: dict) -> None:
    names = list(results)
    first = results[names[0]]
    for name in names[1:]:
        other = results[name]
        if isinstance(first, tuple):
            for a, b in zip(first, other, strict=True):
                assert np.array_equal(np.asarray(a), np.asarray(b)), f"{name} differs from {names[0]}"  # fmt: skip
        else:
            assert torch.equal(first, other), f"{name} differs from {names[0]}"
    assert len(names) >= 2


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_gemm_is_a_matrix_product(m, k, n):
    gen = torch.Generator().manual_seed(m * 1000 + k)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    exact = (x.double() @ w.double().T).float()
    assert torch.allclose(kernels.gemm(x, w), exact, rtol=1e-5, atol=1e-4 * math.sqrt(k))


@pytest.mark.parametrize(("m", "k", "n"), SHAPES)
def test_gemm_bits_do_not_depend_on_the_implementation_or_threads(m, k, n):
    gen = torch.Generator().manual_seed(7)
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    results = implementations(lambda: kernels.gemm(x, w))
    results["1 thread"] = kernels.gemm(x, w, threads=1)
    results["3 threads"] = kernels.gemm(x, w, threads=3)
    assert_all_bitwise_equal(results)


def test_a_gemm_row_does_not_depend_on_its_neighbours_or_the_row_count():
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(960, 576, generator=gen)
    probe = torch.randn(1, 576, generator=gen)
    alone = kernels.gemm(probe, w)[0]
    for rows in (2, 3, 4, 5, 7, 8, 63, 64, 65, 130, 300):
        for position in (0, rows // 2, rows - 1):
            x = torch.randn(rows, 576, generator=gen) * 10
            x[position] = probe[0]
            assert torch.equal(kernels.gemm(x, w)[position], alone), (rows, position)
    # rows of a strided view (a slice of a wider tensor) are read in place
    wide = torch.randn(4, 700, generator=gen)
    wide[2, :576] = probe[0]
    assert torch.equal(kernels.gemm(wide[:, :576], w)[2], alone)


def test_rms_norm_and_swiglu_are_right_and_row_invariant():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(9, 576, generator=gen) * 3
    weight = torch.rand(576, generator=gen) + 0.5
    expected = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    got = kernels.rms_norm(x, weight, 1e-5)
    assert torch.allclose(got, expected, rtol=2e-6, atol=1e-6)
    assert torch.equal(kernels.rms_norm(x[4:5], weight, 1e-5)[0], got[4])
    assert_all_bitwise_equal(implementations(lambda: kernels.rms_norm(x, weight, 1e-5)))

    gu = torch.randn(9, 2 * 1536, generator=gen) * 6
    expected = F.silu(gu[:, :1536]) * gu[:, 1536:]
    got = kernels.silu_mul(gu, 1536)
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(kernels.silu_mul(gu[3:4], 1536)[0], got[3])
    assert_all_bitwise_equal(implementations(lambda: kernels.silu_mul(gu, 1536)))


def test_exp_and_its_sum_are_accurate_and_fixed():
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.uniform(-100, 0, 49152), [0.0, -87.0, -86.99, -1e-30, -0.0]])
    x = x.astype(np.float32)
    probs, total = kernels.exp_shifted(x, 0.0)
    exact = np.exp(np.maximum(x.astype(np.float64), -87.0))
    assert np.max(np.abs(probs - exact) / exact) < 3e-7  # about 2 ulp at worst
    assert probs[-5] == 1.0 and probs[-1] == 1.0 and probs.min() > 0  # clamped, never subnormal
    assert total == pytest.approx(exact.sum(), rel=1e-7)
    assert_all_bitwise_equal(implementations(lambda: kernels.exp_shifted(x, np.float32(0.5))))


def test_log_is_accurate_to_a_few_ulp():
    # float64, rounded to float32 when it becomes a logprob: 4 ulp is far below that
    rng = np.random.default_rng(2)
    values = np.concatenate([rng.uniform(0.5, 2.0, 2000), 10.0 ** rng.uniform(-300, 300, 2000)])
    for v in values:
        assert abs(kernels.log(float(v)) - math.log(v)) <= 4 * math.ulp(math.log(v)) + 1e-300
    assert kernels.log(1.0) == 0.0
    assert kernels.log(0.0) == -math.inf and math.isnan(kernels.log(-1.0))


def _attention_case(gen, lengths, heads=9, kv_heads=3, d=64, layers=2):
    """Random q/k/v rows for sequences of these lengths (prefill: positions 0..n-1)."""
    caches = [torch.zeros(layers, 2, kv_heads, n + 3, d) for n in lengths]
    ptrs = np.repeat(np.array([c.data_ptr() for c in caches], dtype=np.int64), lengths)
    caps = np.repeat(np.array([c.shape[3] for c in caches], dtype=np.int64), lengths)
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32)
    rows = int(sum(lengths))
    q = torch.randn(rows, heads * d, generator=gen) / 8
    k = torch.randn(rows, kv_heads * d, generator=gen)
    v = torch.randn(rows, kv_heads * d, generator=gen)
    return caches, ptrs, caps, pos, q, k, v


def test_attention_is_causal_softmax_attention_and_row_invariant():
    gen = torch.Generator().manual_seed(9)
    lengths = [5, 1, 40]
    caches, ptrs, caps, pos, q, k, v = _attention_case(gen, lengths)
    out = kernels.attention(q, k, v, 1, ptrs, caps, pos, 9, 3, 64)
    # reference in float64, sequence by sequence
    start = 0
    for n in lengths:
        qs = q[start : start + n].double().view(n, 3, 3, 64)  # (rows, kv, group, d)
        ks = k[start : start + n].double().view(n, 3, 64)
        vs = v[start : start + n].double().view(n, 3, 64)
        scores = torch.einsum("rhgd,jhd->rhgj", qs, ks)
        scores = scores.masked_fill(torch.ones(n, n).triu(1).bool()[:, None, None, :], -math.inf)
        expected = torch.einsum("rhgj,jhd->rhgd", scores.softmax(-1), vs).reshape(n, -1)
        assert torch.allclose(out[start : start + n].double(), expected, rtol=1e-5, atol=1e-6)
        start += n
    # each row's k and v were written into its cache at its position (layer 1)
    assert torch.equal(caches[2][1, 0, :, 39], k[45].view(3, 64))
    assert torch.equal(caches[2][1, 1, :, 7], v[13].view(3, 64))
    # the 40-token sequence alone gives the same bits as in the batch
    alone = _attention_case(torch.Generator().manual_seed(9), lengths)  # same values
    c2, p2, cap2, pos2, q2, k2, v2 = alone
    sl = slice(6, 46)
    solo = kernels.attention(
        q2[sl].contiguous(), k2[sl].contiguous(), v2[sl].contiguous(), 1,
        p2[sl].copy(), cap2[sl].copy(), pos2[sl].copy(), 9, 3, 64,
    )  # fmt: skip
    assert torch.equal(solo, out[sl])

    def again():
        c, p, cp, ps, qq, kk, vv = _attention_case(torch.Generator().manual_seed(9), lengths)
        return kernels.attention(qq, kk, vv, 1, p, cp, ps, 9, 3, 64)

    assert_all_bitwise_equal(implementations(again))


def test_a_row_outside_its_cache_is_refused_before_the_kernel_writes():
    from rollout.engines.smollm2.llama import KVCache, LlamaConfig, _Rows

    cfg = LlamaConfig(576, 2, 9, 3, 64, 1536, 100, 1e-5, 10000.0, 64)
    cache = KVCache(cfg, 4)
    with pytest.raises(ValueError, match="outside its KV cache"):
        _Rows.of([cache], np.array([4]), [1])


def test_a_missing_compiler_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("ROLLOUT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(EngineError, match="C compiler"):
        kernels.build()


def test_the_build_is_cached_and_atomic(monkeypatch, tmp_path):
    monkeypatch.setenv("ROLLOUT_CACHE", str(tmp_path))
    first = kernels.build()
    assert first.is_file() and first.is_relative_to(tmp_path)
    assert kernels.build() == first and first.stat().st_mtime == kernels.build().stat().st_mtime
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary left
