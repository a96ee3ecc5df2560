"""`engine.options.device: cuda`: the tiled forward, here on the CPU, and on a GPU where one is.

The tiled forward is what runs on a CUDA GPU; it runs on any torch device, so its
arithmetic is checked here against the CPU kernels. Its batch invariance rests on the GPU
libraries choosing kernels by shape, which only a GPU can show: the `gpu` test.
"""

from __future__ import annotations

import pytest
import torch

from rollout.engines import create_engine
from rollout.engines.smollm2.engine import SmolLM2Engine
from rollout.engines.smollm2.llama import LlamaCPU
from rollout.engines.smollm2.tiled import TILE_ROWS, LlamaTiled
from rollout.errors import ConfigError
from tests.engines.smollm2 import workload
from tests.engines.smollm2.test_batch_invariance import assert_bitwise_equal


def _steps(model, prompts, steps: int = 4) -> torch.Tensor:
    caches = [model.new_cache(len(p) + steps + 1) for p in prompts]
    out = [model.prefill(prompts, caches)]
    for _ in range(steps):
        out.append(model.decode([int(t) for t in out[-1].argmax(-1)], caches))
    return torch.stack([o.cpu() for o in out])


def test_the_tiled_forward_computes_what_the_kernels_compute(smollm2):
    from rollout.engines.smollm2.weights import ensure_cached

    cached = ensure_cached()
    tiled = LlamaTiled(smollm2._model.cfg, cached.state_dict(), "cpu")
    # more rows than a tile in the prefill, so that padding and several tiles take part
    prompts = [smollm2.encode("The history of computing is long. " * 12), smollm2.encode("Hi")]
    assert sum(map(len, prompts)) > TILE_ROWS
    ours, theirs = _steps(smollm2._model, prompts), _steps(tiled, prompts)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert (ours - theirs).abs().max() < 1e-3
    assert tiled.numerics() == {"forward": "tiled-torch-v1", "tile_rows": 64, "device": "cpu"}


def test_cuda_without_a_gpu_is_a_clear_config_error():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is visible: the refusal cannot be shown here")
    engine = create_engine("smollm2", device="cuda")
    with pytest.raises(ConfigError, match="engine.options.device.*no CUDA GPU is visible"):
        engine.start()
    with pytest.raises(ConfigError, match="engine.options.device"):
        create_engine("smollm2", device="tpu")


def test_cuda_engines_are_started_with_a_deterministic_cublas():
    assert SmolLM2Engine.process_env({"device": "cuda"})["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert "CUBLAS_WORKSPACE_CONFIG" not in SmolLM2Engine.process_env({})


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is false)"
)
def test_the_invariance_workload_on_a_gpu():
    """The CPU workload on the GPU: batch 64, batch 8 in reverse order, and batch 1 on a
    subset, bitwise; the self-test passed there; close to the CPU engine's numbers."""
    big = create_engine("smollm2", device="cuda", max_num_seqs=64)
    big.start()
    reqs = workload.requests(big)
    batch64 = workload.as_records(big.generate(reqs))
    fp = big.fingerprint()
    assert fp["batch_invariant"] is True and fp["numerics"]["device"] == "cuda"
    small = create_engine("smollm2", device="cuda", max_num_seqs=8)
    small.start()
    batch8 = workload.as_records(small.generate(reqs[::-1]))[::-1]
    assert_bitwise_equal(batch64, batch8)
    one = create_engine("smollm2", device="cuda", max_num_seqs=1)
    one.start()
    subset = reqs[::7]
    batch1 = workload.as_records(one.generate(subset))
    assert_bitwise_equal([batch64[int(r.request_id)] for r in subset], batch1)
    assert isinstance(big._model, LlamaCPU) and big._model.device.type == "cuda"
