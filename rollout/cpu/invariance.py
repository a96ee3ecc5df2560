"""Start-up self-test: is a row's GEMM result independent of the rows around it?

Batch invariance rests on the CPU GEMM giving a row the same bits whatever the number
of rows in the call, its position, and what the other rows hold (MKL's strict mode,
`numerics.py`). That depends on the library, its settings and the CPU, so it is checked
on the real weights whenever an engine starts.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

ROW_COUNTS = (2, 3, 7, 16, 33, 64, 130)


@torch.inference_mode()
def check_row_invariance(weights: Iterable[torch.Tensor], seed: int = 1234) -> list[str]:
    """Problems found; empty when a probe row matched itself alone, bitwise, in every call.

    The probe goes first, last and at a random place among random rows, in calls of
    `ROW_COUNTS` rows, and must give the bits it gives in a one-row call.
    """
    problems: list[str] = []
    gen = torch.Generator().manual_seed(seed)
    for w in weights:
        probe = torch.randn(w.shape[1], generator=gen)
        alone = F.linear(probe[None], w)[0]
        for rows in ROW_COUNTS:
            middle = int(torch.randint(0, rows, (1,), generator=gen))
            for position in sorted({0, middle, rows - 1}):
                x = torch.randn(rows, w.shape[1], generator=gen)
                x[position] = probe
                if not torch.equal(F.linear(x, w)[position], alone):
                    problems.append(
                        f"GEMM by a {tuple(w.shape)} weight: a row's result changes at "
                        f"position {position} of {rows} rows"
                    )
    return problems
