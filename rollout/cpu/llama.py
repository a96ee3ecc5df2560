"""A batch-invariant Llama forward pass for the CPU (float32).

Why not transformers' batched `generate`: its CPU results for a row depend on the
batch (left padding and the GEMM's blocking change the last bits of the logits), so
a sampled sequence can change with its batch mates. Here:

- every projection is one GEMM over the rows of all sequences, run in MKL's strict
  reproducible mode (`numerics.py`), in which a row's result does not depend on the
  number of rows or on the other rows (checked at start by `invariance.py`);
- attention is computed per sequence (its own KV cache, its own length), explicitly
  (q @ K^T, softmax, @ V), so no padding takes part and the result is the same at any
  thread count;
- prompts are prefilled packed (all prompt tokens of a step in one GEMM, no padding).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @classmethod
    def from_hf(cls, cfg: dict) -> LlamaConfig:
        rope = cfg.get("rope_parameters") or {}
        return cls(
            hidden_size=cfg["hidden_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg["num_key_value_heads"],
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
            intermediate_size=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=float(cfg["rms_norm_eps"]),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            max_position_embeddings=cfg["max_position_embeddings"],
        )


@dataclass
class _Layer:
    attn_norm: torch.Tensor
    w_qkv: torch.Tensor  # (q + k + v, hidden)
    w_o: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor  # (2 * intermediate, hidden)
    w_down: torch.Tensor


class KVCache:
    """One sequence's keys and values for every layer; grows in blocks as tokens arrive."""

    GROW = 256

    def __init__(self, cfg: LlamaConfig, capacity: int) -> None:
        self.cfg = cfg
        self.length = 0
        self.data = torch.empty(cfg.num_layers, 2, cfg.num_kv_heads, max(capacity, 1), cfg.head_dim)

    def reserve(self, length: int) -> None:
        capacity = self.data.shape[3]
        if length <= capacity:
            return
        new_cap = max(length, capacity + self.GROW)
        grown = torch.empty(*self.data.shape[:3], new_cap, self.data.shape[4])
        grown[:, :, :, :capacity] = self.data
        self.data = grown


class LlamaCPU:
    """The model: weights fused per layer (q|k|v and gate|up) and the forward passes."""

    def __init__(self, cfg: LlamaConfig, state: dict[str, torch.Tensor]) -> None:
        self.cfg = cfg
        self.embed = state["model.embed_tokens.weight"].contiguous()
        self.lm_head = state.get("lm_head.weight", self.embed).contiguous()
        self.final_norm = state["model.norm.weight"]
        self.layers: list[_Layer] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(
                _Layer(
                    attn_norm=state[p + "input_layernorm.weight"],
                    w_qkv=torch.cat(
                        [state[p + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")]
                    ).contiguous(),
                    w_o=state[p + "self_attn.o_proj.weight"].contiguous(),
                    mlp_norm=state[p + "post_attention_layernorm.weight"],
                    w_gate_up=torch.cat(
                        [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]]
                    ).contiguous(),
                    w_down=state[p + "mlp.down_proj.weight"].contiguous(),
                )
            )
        half = cfg.head_dim // 2
        inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, half, dtype=torch.float64) * 2 / cfg.head_dim)
        )
        angles = torch.arange(cfg.max_position_embeddings, dtype=torch.float64)[:, None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        self.cos = angles.cos().float()
        self.sin = angles.sin().float()
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.group = cfg.num_heads // cfg.num_kv_heads
        self.scale = cfg.head_dim**-0.5

    # -- pieces -------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.cfg.rms_norm_eps))

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (rows, heads, head_dim); positions: (rows,)."""
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _qkv(self, layer: _Layer, x: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        qkv = F.linear(self._norm(x, layer.attn_norm), layer.w_qkv)
        q = qkv[:, : self.q_size].reshape(-1, cfg.num_heads, cfg.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(
            -1, cfg.num_kv_heads, cfg.head_dim
        )
        v = qkv[:, self.q_size + self.kv_size :].reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        return self._rope(q, positions), self._rope(k, positions), v

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        inter = self.cfg.intermediate_size
        gate_up = F.linear(self._norm(x, layer.mlp_norm), layer.w_gate_up)
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        return x + F.linear(act, layer.w_down)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._norm(x, self.final_norm), self.lm_head)

    def gemm_weights(self) -> list[torch.Tensor]:
        """Every distinct weight shape the passes multiply by, for the self-test."""
        layer = self.layers[0]
        return [layer.w_qkv, layer.w_o, layer.w_gate_up, layer.w_down, self.lm_head]

    # -- passes ---------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompts: Sequence[Sequence[int]], caches: Sequence[KVCache]) -> torch.Tensor:
        """Run whole prompts (packed, no padding), fill their caches; logits of each last token."""
        cfg = self.cfg
        lengths = [len(p) for p in prompts]
        tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lengths])
        starts = [0]
        for n in lengths:
            starts.append(starts[-1] + n)
        for cache, n in zip(caches, lengths, strict=True):
            cache.reserve(n)
        causal = {n: torch.ones(n, n, dtype=torch.bool).tril_() for n in set(lengths)}
        x = self.embed[tokens]
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions)
            attn = torch.empty(x.shape[0], self.q_size)
            for s, cache in enumerate(caches):
                a, b, n = starts[s], starts[s + 1], lengths[s]
                ks = k[a:b].transpose(0, 1)  # (kv_heads, n, d)
                vs = v[a:b].transpose(0, 1)
                cache.data[li, 0, :, :n] = ks
                cache.data[li, 1, :, :n] = vs
                qs = q[a:b].transpose(0, 1).reshape(cfg.num_kv_heads, self.group, n, cfg.head_dim)
                scores = torch.matmul(qs, ks.unsqueeze(1).transpose(-1, -2)) * self.scale
                scores = scores.masked_fill(~causal[n], float("-inf")).softmax(-1)
                out = torch.matmul(scores, vs.unsqueeze(1))  # (kv, group, n, d)
                attn[a:b] = (
                    out.reshape(cfg.num_heads, n, cfg.head_dim)
                    .transpose(0, 1)
                    .reshape(n, self.q_size)
                )
            x = x + F.linear(attn, layer.w_o)
            x = self._mlp(layer, x)
        for cache, n in zip(caches, lengths, strict=True):
            cache.length = n
        last = torch.tensor([b - 1 for b in starts[1:]], dtype=torch.long)
        return self._logits(x[last])

    @torch.inference_mode()
    def decode(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> torch.Tensor:
        """One step for each sequence: append its token, return next-token logits."""
        cfg = self.cfg
        positions = torch.tensor([c.length for c in caches], dtype=torch.long)
        for cache in caches:
            cache.reserve(cache.length + 1)
        x = self.embed[torch.tensor(list(tokens), dtype=torch.long)]
        group_shape = (-1, cfg.num_kv_heads, self.group, cfg.head_dim)
        for li, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions)
            # Scaling q by 1/sqrt(head_dim) before q @ K^T instead of after: the scale
            # is applied once per step rather than once per sequence.
            q = (q * self.scale).reshape(group_shape)
            new_kv = torch.stack([k, v], dim=1)  # (rows, 2, kv_heads, head_dim)
            outs = []
            for s, cache in enumerate(caches):
                n = cache.length + 1
                kv = cache.data[li]
                kv[:, :, n - 1] = new_kv[s]
                probs = torch.bmm(q[s], kv[0, :, :n].transpose(1, 2)).softmax(-1)
                outs.append(torch.bmm(probs, kv[1, :, :n]))
            attn = torch.stack(outs).reshape(len(caches), self.q_size)
            x = x + F.linear(attn, layer.w_o)
            x = self._mlp(layer, x)
        for cache in caches:
            cache.length += 1
        return self._logits(x)
