"""Start-up self-test: does a row get the same bits whatever is computed beside it?

Invariance holds by construction (`kernels.c` sums every reduction in an order fixed
by its length); this guard checks, on the real weights whenever an engine starts, that
the built library does what its source says on this CPU and with this compiler:

- GEMM, for every weight shape the passes use: a probe row alone, then first, last and
  at a random place among random rows in calls of 2 to 130 rows, at 1 and N threads,
  and (where the CPU has AVX2) in the AVX2 and the portable kernels;
- RMSNorm and SwiGLU: a probe row alone and among others;
- the whole forward pass (attention, RoPE, norms, residuals, the LM head): a probe
  prompt prefilled and decoded one step alone, then among other sequences of other
  lengths, at 1 and N threads: the logits must be bitwise equal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rollout.engines.smollm2 import kernels
from rollout.engines.smollm2.llama import LlamaCPU

ROW_COUNTS = (2, 3, 7, 16, 33, 64, 130)
HEAD_ROW_COUNTS = (2, 7, 16)  # the LM head is 85x the others: fewer calls


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _uses_kernels(model: LlamaCPU) -> bool:
    """The CPU engine's own forward (the kernels), not a torch-operator one (GPU)."""
    return type(model) is LlamaCPU


def _gemm(model: LlamaCPU, gen: torch.Generator) -> list[str]:
    problems: list[str] = []
    device = model.device
    for w in model.gemm_weights():
        counts = HEAD_ROW_COUNTS if w is model.lm_head else ROW_COUNTS
        probe = torch.randn(1, w.shape[1], generator=gen).to(device)
        alone = model._linear(probe, w)[0]
        for rows in counts:
            middle = int(torch.randint(0, rows, (1,), generator=gen))
            for position in sorted({0, middle, rows - 1}):
                x = torch.randn(rows, w.shape[1], generator=gen).to(device)
                x[position] = probe[0]
                if not torch.equal(model._linear(x, w)[position], alone):
                    problems.append(f"GEMM by a {tuple(w.shape)} weight: a row's result changes at position {position} of {rows} rows")  # fmt: skip
        if not _uses_kernels(model):
            continue
        # Kernel paths and thread counts on 5 rows; the first 4,096 outputs of the LM head
        # suffice (an output's order does not depend on how many there are).
        x = torch.randn(5, w.shape[1], generator=gen)
        part = w[:4096]
        paths = (1, 0) if kernels.simd() else (0,)
        reference = kernels.gemm(x, part, threads=1, path=paths[0])
        for path in paths:
            for threads in (1, max(2, torch.get_num_threads())):
                if not torch.equal(kernels.gemm(x, part, threads=threads, path=path), reference):
                    problems.append(f"GEMM by a {tuple(w.shape)} weight: the {'AVX2' if path else 'portable'} kernel at {threads} threads differs")  # fmt: skip
    return problems


def _rowwise(model: LlamaCPU, gen: torch.Generator) -> list[str]:
    cfg = model.cfg
    layer = model.layers[0]
    problems: list[str] = []
    x = (torch.randn(33, cfg.hidden_size, generator=gen) * 3).to(model.device)
    if not torch.equal(model._norm(x, layer.attn_norm)[20], model._norm(x[20:21], layer.attn_norm)[0]):  # fmt: skip
        problems.append("RMSNorm: a row's result changes with the rows beside it")
    if not _uses_kernels(model):
        return problems  # SwiGLU is elementwise in torch's forward
    gu = torch.randn(33, 2 * cfg.intermediate_size, generator=gen) * 4
    inter = cfg.intermediate_size
    if not torch.equal(kernels.silu_mul(gu, inter)[5], kernels.silu_mul(gu[5:6], inter)[0]):
        problems.append("SwiGLU: a row's result changes with the rows beside it")
    return problems


def _forward(model: LlamaCPU, gen: torch.Generator) -> list[str]:
    """Prefill + one decode step of a probe, alone and among others of other lengths."""
    vocab = model.cfg.vocab_size

    def run(prompts: list[list[int]], at: int) -> tuple[torch.Tensor, torch.Tensor]:
        caches = [model.new_cache(len(p) + 1) for p in prompts]
        first = model.prefill(prompts, caches)
        tokens = [int(t) for t in first.argmax(-1)]
        second = model.decode(tokens, caches)
        return first[at], second[at]

    probe = [int(t) for t in torch.randint(3, vocab, (9,), generator=gen)]
    others = [[int(t) for t in torch.randint(3, vocab, (n,), generator=gen)] for n in (1, 23, 4)]
    alone = run([probe], 0)
    problems: list[str] = []
    with _threads(1):
        single_thread = run([probe], 0)
    together = run([others[0], others[1], probe, others[2]], 2)
    for name, got in (("among 3 other sequences", together), ("at 1 thread", single_thread)):
        for step, a, b in (("prefill", alone[0], got[0]), ("decode", alone[1], got[1])):
            if not torch.equal(a, b):
                problems.append(f"forward pass ({step}): a sequence's logits change {name}")
    return problems


@torch.inference_mode()
def check_invariance(model: LlamaCPU, seed: int = 1234) -> list[str]:
    """Problems found; empty when every probe matched itself bitwise."""
    gen = torch.Generator().manual_seed(seed)
    return _gemm(model, gen) + _rowwise(model, gen) + _forward(model, gen)
