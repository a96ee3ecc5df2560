"""The invariance workload under every code path one machine can force.

The CPUs under this project's machines vary (Intel Xeon, AMD EPYC with and without
AVX-512). What a CPU changes is which kernels the libraries pick, and these switches pick
them on one machine: our kernels' portable C instead of AVX2, MKL's AVX2 branch on an
AVX-512 CPU, MKL's other reproducibility modes, torch's AVX2 and scalar ("default")
kernels, one thread. Each runs in a fresh process at another batch size and in reverse
order, and must give this process's tokens and logprobs bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engines.smollm2 import workload
from tests.engines.smollm2.test_batch_invariance import (
    assert_bitwise_equal,
    child_output,
    start_child,
)

pytestmark = pytest.mark.slow

FORCED: dict[str, dict[str, str]] = {
    "portable kernels": {"ROLLOUT_KERNELS": "generic"},
    "MKL AVX2 branch": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "torch avx2 kernels": {"ATEN_CPU_CAPABILITY": "avx2"},
    "torch scalar kernels": {"ATEN_CPU_CAPABILITY": "default"},
    "all at once, 1 thread": {
        "ROLLOUT_KERNELS": "generic",
        "ATEN_CPU_CAPABILITY": "default",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    },
}
LIMIT = 12  # the workload's first 12 prompts (1 to 70 tokens), 16 new tokens each


def test_same_bits_under_every_forced_code_path(smollm2_factory, tmp_path: Path):
    engine = smollm2_factory(max_num_seqs=64)
    here = workload.as_records(engine.generate(workload.requests(engine, limit=LIMIT)))
    assert len({tuple(r["tokens"]) for r in here}) >= 10  # sampled, mostly distinct

    outputs = {}
    for i, (name, env) in enumerate(FORCED.items()):
        # each child at another batch size, half of them in reverse order
        proc = start_child(tmp_path / f"{i}.json", max_num_seqs=(3, 5, 1 + i)[i % 3] or 1,
                           limit=LIMIT, env=env, reverse=bool(i % 2))  # fmt: skip
        outputs[name] = child_output(proc, tmp_path / f"{i}.json")

    ran = {name: out["ran"] for name, out in outputs.items()}
    # the switches took effect
    assert ran["portable kernels"]["kernels"] == "portable C"
    assert ran["torch scalar kernels"]["aten_cpu_capability"] == "DEFAULT"
    assert ran["torch avx2 kernels"]["aten_cpu_capability"] in ("AVX2", "DEFAULT")
    assert ran["all at once, 1 thread"]["threads"] == 1
    for name, out in outputs.items():
        assert out["ran"]["batch_invariant"] is True, name
        assert_bitwise_equal(here, out["records"])
