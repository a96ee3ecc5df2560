"""The smollm2 forward pass for a CUDA GPU (`engine.options.device: cuda`).

The CPU kernels (`kernels.c`) do not run on a GPU, so here invariance rests on fixed
shapes instead: every operation that mixes values across a row (the GEMMs and the LM
head, the norms' reductions) is called on tiles of exactly `TILE_ROWS` rows, the last one
zero-padded, so cuBLAS and torch's reduction kernels see one shape, and pick one kernel,
whatever the batch holds. Attention runs per sequence (its shapes depend on that sequence
alone); elementwise operations are the same per element at any size; sampling stays on
the CPU kernels. cuBLAS must also run deterministically: `CUBLAS_WORKSPACE_CONFIG` is set
in the engine process's environment before CUDA starts (`SmolLM2Engine.process_env`).

This rests on the libraries choosing their kernels by shape, which is measured, not
guaranteed: the start-up self-test checks it on the GPU at hand, and the `gpu`-marked test
runs the batch-invariance workload there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rollout.engines.smollm2.llama import LlamaConfig
from rollout.engines.smollm2.reference import LlamaTorch

TILE_ROWS = 64


class LlamaTiled(LlamaTorch):
    """The torch-operator forward with fixed-shape calls, on any torch device."""

    def __init__(self, cfg: LlamaConfig, state: dict[str, torch.Tensor], device: str) -> None:
        super().__init__(cfg, state)
        self.device = torch.device(device)
        for name in ("embed", "lm_head", "final_norm", "cos", "sin"):
            setattr(self, name, getattr(self, name).to(self.device))
        for layer in self.layers:
            for name, value in vars(layer).items():
                setattr(layer, name, value.to(self.device))

    def _tiles(self, x: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """fn over x in tiles of TILE_ROWS rows (zero-padded), concatenated and cut back."""
        rows = x.shape[0]
        padded = torch.zeros(-(-rows // TILE_ROWS) * TILE_ROWS, x.shape[1], device=x.device)
        padded[:rows] = x
        tiles = [fn(padded[i : i + TILE_ROWS]) for i in range(0, padded.shape[0], TILE_ROWS)]
        return torch.cat(tiles)[:rows]

    def _linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self._tiles(x, lambda tile: torch.nn.functional.linear(tile, w))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        norm = super()._norm
        return self._tiles(x, lambda tile: norm(tile, weight))

    def numerics(self) -> dict[str, object]:
        """What decides this forward's bits, for the engine fingerprint."""
        info: dict[str, object] = {"forward": "tiled-torch-v1", "tile_rows": TILE_ROWS,
                                   "device": self.device.type}  # fmt: skip
        if self.device.type == "cuda":
            info |= {
                "gpu": torch.cuda.get_device_name(self.device),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(self.device))),
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
            }
        return info
