"""Start-up self-test: is a row's GEMM result independent of its place and its neighbours?

Batch invariance rests on the CPU GEMM giving a row the same bits wherever it sits in a
fixed-shape call and whatever the other rows hold. That is a property of the GEMM
library's blocking on this CPU, so it is checked on the real weights when an engine
starts; an engine that fails it does not claim invariance.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rollout.cpu.llama import linear


@torch.inference_mode()
def check_row_invariance(pairs: Iterable[tuple[torch.Tensor, int]], seed: int = 1234) -> list[str]:
    """Problems found for (weight, rows per call) pairs; empty when every row matched bitwise."""
    problems: list[str] = []
    gen = torch.Generator().manual_seed(seed)
    for w, rows in pairs:
        probe = torch.randn(w.shape[1], generator=gen)
        expected: torch.Tensor | None = None
        for position in sorted({0, 1, rows // 2, rows - 1}):
            for count in (position + 1, rows):  # the probe last in a padded call, or in a full one
                x = torch.randn(count, w.shape[1], generator=gen)
                x[position] = probe
                got = linear(x, w, rows)[position]
                if expected is None:
                    expected = got
                elif not torch.equal(got, expected):
                    problems.append(
                        f"GEMM {tuple(w.shape)} in {rows}-row calls: a row's result changes "
                        f"at position {position} among {count} rows"
                    )
    return problems
