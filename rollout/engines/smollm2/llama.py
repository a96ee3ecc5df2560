"""A batch-invariant Llama forward pass for the CPU (float32).

Why not transformers' batched `generate`: its CPU results for a row depend on the
batch (left padding, and a BLAS that chooses its summation order from the matrix
shape), so a sampled sequence can change with its batch mates. Here every reduction
runs in `kernels.c`, summed in an order fixed by its length alone:

- projections and the LM head: one fixed-order GEMM over the rows of all sequences;
- RMSNorm, SwiGLU: per row, in the same kernels;
- attention: per sequence (its own KV cache, its own length, no padding), scores,
  softmax and the weighted sum of values in key order;
- what is left in torch is elementwise IEEE arithmetic (residual adds, RoPE) and data
  movement, which give the same bits on every CPU, at any thread count.

Prompts are prefilled packed (all prompt tokens of a step in one GEMM, no padding).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rollout.engines.smollm2 import kernels


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
    """One sequence's keys and values, laid out [layer][k, v][kv_head][position][dim] as the
    attention kernel reads them; grows in blocks as tokens arrive."""

    GROW = 256

    def __init__(self, cfg: LlamaConfig, capacity: int, device: torch.device | str = "cpu") -> None:
        self.cfg = cfg
        self.length = 0
        self.data = torch.empty(
            cfg.num_layers, 2, cfg.num_kv_heads, max(capacity, 1), cfg.head_dim, device=device
        )

    @property
    def capacity(self) -> int:
        return self.data.shape[3]

    def reserve(self, length: int) -> None:
        capacity = self.capacity
        if length <= capacity:
            return
        new_cap = max(length, capacity + self.GROW)
        grown = torch.empty(
            *self.data.shape[:3], new_cap, self.data.shape[4], device=self.data.device
        )
        grown[:, :, :, :capacity] = self.data
        self.data = grown


def rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's rotary angles, computed in float64 with the C
    library's `cos`/`sin` (not a SIMD variant chosen by the CPU) and rounded to float32."""
    half = cfg.head_dim // 2
    inv_freq = [1.0 / (cfg.rope_theta ** (2 * i / cfg.head_dim)) for i in range(half)]
    angles = [p * f for p in range(cfg.max_position_embeddings) for f in inv_freq]
    cos = torch.tensor(np.array([math.cos(a) for a in angles], dtype=np.float32))
    sin = torch.tensor(np.array([math.sin(a) for a in angles], dtype=np.float32))
    cos = cos.view(-1, half)
    sin = sin.view(-1, half)
    return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)


class LlamaCPU:
    """The model: weights fused per layer (q|k|v and gate|up) and the forward passes."""

    device = torch.device("cpu")

    def __init__(self, cfg: LlamaConfig, state: dict[str, torch.Tensor]) -> None:
        self.cfg = cfg
        self.embed = state["model.embed_tokens.weight"].contiguous()
        self.lm_head = state.get("lm_head.weight", self.embed).contiguous()
        self.final_norm = state["model.norm.weight"].contiguous()
        self.layers: list[_Layer] = []
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            self.layers.append(
                _Layer(
                    attn_norm=state[p + "input_layernorm.weight"].contiguous(),
                    w_qkv=torch.cat(
                        [state[p + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")]
                    ).contiguous(),
                    w_o=state[p + "self_attn.o_proj.weight"].contiguous(),
                    mlp_norm=state[p + "post_attention_layernorm.weight"].contiguous(),
                    w_gate_up=torch.cat(
                        [state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]]
                    ).contiguous(),
                    w_down=state[p + "mlp.down_proj.weight"].contiguous(),
                )
            )
        self.cos, self.sin = rope_tables(cfg)
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.scale = cfg.head_dim**-0.5

    def rope_sha256(self) -> str:
        """Checksum of the rotary tables: the one input computed with the C library's math."""
        tables = self.cos.cpu().numpy().tobytes() + self.sin.cpu().numpy().tobytes()
        return hashlib.sha256(tables).hexdigest()

    def new_cache(self, capacity: int) -> KVCache:
        """A KV cache for one sequence, where this model computes."""
        return KVCache(self.cfg, capacity, self.device)

    # -- pieces -------------------------------------------------------------------------
    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return kernels.gemm(x, w)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return kernels.rms_norm(x, weight, self.cfg.rms_norm_eps)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (rows, heads, head_dim); positions: (rows,)."""
        positions = positions.to(self.cos.device)
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _qkv(self, layer: _Layer, x: torch.Tensor, rows: _Rows):
        """q (scaled by 1/sqrt(head_dim): a power of two for head_dim 64, so exact) and k, both
        rotated, as (rows, heads, head_dim); v as (rows, kv_heads * head_dim)."""
        cfg = self.cfg
        qkv = self._linear(self._norm(x, layer.attn_norm), layer.w_qkv)
        n = qkv.shape[0]
        q = qkv[:, : self.q_size].reshape(n, cfg.num_heads, cfg.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].reshape(n, cfg.num_kv_heads, cfg.head_dim)  # fmt: skip
        v = qkv[:, self.q_size + self.kv_size :]
        return self._rope(q, rows.positions) * self.scale, self._rope(k, rows.positions), v

    def _attention(self, li: int, layer: _Layer, x: torch.Tensor, rows: _Rows) -> torch.Tensor:
        """The attention block of layer `li` for these rows, residual included."""
        cfg = self.cfg
        q, k, v = self._qkv(layer, x, rows)
        n = q.shape[0]
        q, k = q.reshape(n, self.q_size), k.reshape(n, self.kv_size)
        attn = kernels.attention(
            q, k, v, li, rows.cache_ptrs, rows.caps, rows.pos32,
            cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
        )  # fmt: skip
        return x + self._linear(attn, layer.w_o)

    def _silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return kernels.silu_mul(gate_up, self.cfg.intermediate_size)

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        gate_up = self._linear(self._norm(x, layer.mlp_norm), layer.w_gate_up)
        return x + self._linear(self._silu_mul(gate_up), layer.w_down)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._linear(self._norm(x, self.final_norm), self.lm_head)

    def gemm_weights(self) -> list[torch.Tensor]:
        """Every distinct weight shape the passes multiply by, for the self-test."""
        layer = self.layers[0]
        return [layer.w_qkv, layer.w_o, layer.w_gate_up, layer.w_down, self.lm_head]

    def _forward(self, tokens: torch.Tensor, rows: _Rows) -> torch.Tensor:
        x = self.embed[tokens.to(self.embed.device)]
        for li, layer in enumerate(self.layers):
            x = self._attention(li, layer, x, rows)
            x = self._mlp(layer, x)
        return x

    # -- passes ---------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, prompts: Sequence[Sequence[int]], caches: Sequence[KVCache]) -> torch.Tensor:
        """Run whole prompts (packed, no padding), fill their caches; logits of each last token."""
        x = self.prefill_states(prompts, caches)
        last = torch.tensor(np.cumsum([len(p) for p in prompts]) - 1, dtype=torch.long)
        return self._logits(x[last.to(x.device)].contiguous())

    @torch.inference_mode()
    def prefill_states(
        self, prompts: Sequence[Sequence[int]], caches: Sequence[KVCache]
    ) -> torch.Tensor:
        """Run whole sequences (packed, no padding), fill their caches; the hidden state of
        every token, rows in order (what `logits` turns into next-token logits)."""
        lengths = [len(p) for p in prompts]
        for cache, n in zip(caches, lengths, strict=True):
            cache.reserve(n)
        tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.long)
        positions = np.concatenate([np.arange(n) for n in lengths])
        x = self._forward(tokens, _Rows.of(caches, positions, lengths))
        for cache, n in zip(caches, lengths, strict=True):
            cache.length = n
        return x

    @torch.inference_mode()
    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Next-token logits of hidden states from `prefill_states` (each row on its own)."""
        return self._logits(states.contiguous())

    @torch.inference_mode()
    def decode(self, tokens: Sequence[int], caches: Sequence[KVCache]) -> torch.Tensor:
        """One step for each sequence: append its token, return next-token logits."""
        for cache in caches:
            cache.reserve(cache.length + 1)
        positions = np.array([c.length for c in caches])
        x = self._forward(
            torch.tensor(list(tokens), dtype=torch.long),
            _Rows.of(caches, positions, [1] * len(caches)),
        )
        for cache in caches:
            cache.length += 1
        return self._logits(x)


@dataclass
class _Rows:
    """Per row of a step: its position and its sequence's cache, as the kernel takes them."""

    positions: torch.Tensor
    pos32: np.ndarray
    cache_ptrs: np.ndarray
    caps: np.ndarray
    caches: list[KVCache]  # per row (the torch reference writes through them)

    @classmethod
    def of(cls, caches: Sequence[KVCache], positions: np.ndarray, counts: Sequence[int]) -> _Rows:
        ptrs = np.repeat(np.array([c.data.data_ptr() for c in caches], dtype=np.int64), counts)
        caps = np.repeat(np.array([c.capacity for c in caches], dtype=np.int64), counts)
        pos32 = np.ascontiguousarray(positions, dtype=np.int32)
        if (pos32 >= caps).any() or (pos32 < 0).any():  # the kernel writes at these positions
            raise ValueError("a row's position lies outside its KV cache")
        per_row = [c for c, n in zip(caches, counts, strict=True) for _ in range(n)]
        return cls(torch.from_numpy(pos32.astype(np.int64)), pos32, ptrs, caps, per_row)
