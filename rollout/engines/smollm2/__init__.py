"""The smollm2 engine: SmolLM2-135M-Instruct on the CPU, batch-invariant by construction.

engine.py (the Engine), llama.py (the forward pass), kernels.c / kernels.py (the fixed-order
CPU kernels), sampler.py (rollout-sampler-v2), selftest.py (the start-up guard), weights.py
(the GGUF file and its converted cache).
"""

from rollout.engines.smollm2.engine import SmolLM2Engine

__all__ = ["SmolLM2Engine"]
