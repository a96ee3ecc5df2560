"""The numerics switch of the CPU engine: MKL's strict reproducibility mode.

In strict CNR mode (`MKL_CBWR=<branch>,STRICT`), MKL's GEMM sums every dot product in
one fixed order. Intel documents it as bitwise reproducible across thread counts
(AVX2 / AVX-512 branches); measured here, it also gives a row the same bits whatever
the number of rows in the call and whatever the other rows hold, which is what batch
invariance needs, with no padding. Without it MKL picks its blocking from the matrix
shape, so a row's result changes with the batch size (classes of 1, 2-15, 16-48 and
64-128 rows were measured on this machine kind).

MKL reads the setting at the process's first matrix multiply, so it must be in the
environment before then, as DeepInfer's switches must be set before it is imported.
`rollout` sets it when the engine module is imported; the engine's start-up
self-test (`invariance.py`) verifies that it took effect.
"""

from __future__ import annotations

import os

STRICT_SETTING = "AUTO,STRICT"


def request_strict_gemm() -> None:
    """Put MKL in strict reproducible mode unless the environment already chose a mode."""
    os.environ.setdefault("MKL_CBWR", STRICT_SETTING)


def gemm_mode() -> dict[str, str]:
    """What decides the GEMM's numerics, for the engine fingerprint."""
    import torch

    config = torch.__config__.show()
    blas = "mkl" if "BLAS_INFO=mkl" in config else "other"
    return {
        "blas": blas,
        "mkl_cbwr": os.environ.get("MKL_CBWR", ""),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
