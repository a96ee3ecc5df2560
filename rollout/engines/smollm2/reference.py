"""The same forward pass on torch's own operators (the BLAS's GEMM, torch's softmax and norms).

Not batch-invariant: what the engine was before its fixed-order kernels. Kept for two
checks: the engine computes the same function as this to float precision (tests), and
what invariance costs, the engine against this in one run (`scripts/bench_engine.py`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rollout.engines.smollm2.llama import LlamaCPU, _Layer, _Rows


class LlamaTorch(LlamaCPU):
    """LlamaCPU with every kernel replaced by torch operators; attention per sequence."""

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.cfg.rms_norm_eps))

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.linear(x, w)

    def _silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        inter = self.cfg.intermediate_size
        return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]

    def _attention(self, li: int, layer: _Layer, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self._qkv(layer, x, rows)
        n = q.shape[0]
        v = v.reshape(n, cfg.num_kv_heads, cfg.head_dim)
        group = cfg.num_heads // cfg.num_kv_heads
        out = torch.empty(n, self.q_size, device=x.device)
        # rows of one sequence are contiguous: split where the cache changes
        bounds = np.flatnonzero(np.diff(rows.cache_ptrs)) + 1
        for a, b in zip([0, *bounds], [*bounds, n], strict=True):
            cache = rows.caches[a]
            pos = rows.pos32[a:b]
            at = torch.from_numpy(pos.astype(np.int64)).to(x.device)
            cache.data[li, 0, :, at] = k[a:b].transpose(0, 1)
            cache.data[li, 1, :, at] = v[a:b].transpose(0, 1)
            keys = int(pos[-1]) + 1
            ks = cache.data[li, 0, :, :keys]  # (kv, keys, d)
            vs = cache.data[li, 1, :, :keys]
            qs = q[a:b].transpose(0, 1).reshape(cfg.num_kv_heads, group, b - a, cfg.head_dim)
            scores = torch.matmul(qs, ks.unsqueeze(1).transpose(-1, -2))  # (kv, g, rows, keys)
            future = torch.from_numpy(np.arange(keys)[None, :] > pos[:, None]).to(x.device)
            probs = scores.masked_fill(future, float("-inf")).softmax(-1)
            o = torch.matmul(probs, vs.unsqueeze(1))  # (kv, g, rows, d)
            out[a:b] = o.reshape(cfg.num_heads, b - a, cfg.head_dim).transpose(0, 1).reshape(b - a, -1)  # fmt: skip
        return x + self._linear(out, layer.w_o)
