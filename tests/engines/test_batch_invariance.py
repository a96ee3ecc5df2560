"""Bitwise batch invariance of the smollm2 engine (the issue's workload).

64 prompts of 1 to 400 tokens, temperature 0.8, top_p 0.95, 48 new tokens: token ids
and logprobs must be identical between batch sizes 1, 8 and 64, between two orders of
the prompts, and between two processes. Batch size 1 runs in a separate process (with
one thread) while this one runs batch 64 and batch 8 on reversed prompts (also one
thread each, so the two processes share the two cores).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.engines import workload

pytestmark = pytest.mark.slow


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_outputs_identical_across_batch_sizes_orders_and_processes(
    smollm2_factory, tmp_path: Path, one_thread
):
    out = tmp_path / "batch1.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    script = Path(workload.__file__)
    child = subprocess.Popen(
        [sys.executable, str(script), str(out), "1"], env=env, cwd=script.parents[2]
    )
    try:
        engine64 = smollm2_factory(max_num_seqs=64)
        reqs = workload.requests(engine64)
        assert sorted({len(r.prompt_token_ids) for r in reqs})[::63] == [1, 400]
        batch64 = workload.as_records(engine64.generate(reqs))
        engine8 = smollm2_factory(max_num_seqs=8)
        batch8_reversed = workload.as_records(engine8.generate(reqs[::-1]))[::-1]
    finally:
        assert child.wait(timeout=1800) == 0
    batch1 = json.loads(out.read_text())

    # Sampled (not greedy) and long enough to diverge if anything leaked.
    assert len({tuple(r["tokens"]) for r in batch64}) == 64
    assert all(len(r["tokens"]) >= 1 and len(r["logprobs"]) == len(r["tokens"]) for r in batch64)
    json64 = json.loads(json.dumps(batch64))  # floats through JSON as the child's were
    assert json64 == batch1
    assert batch64 == batch8_reversed
    # JSON keeps float32 values exactly: compare the raw bits too.
    for a, b in zip(batch64, batch1, strict=True):
        bits_a = torch.tensor(a["logprobs"], dtype=torch.float32).view(torch.int32)
        bits_b = torch.tensor(b["logprobs"], dtype=torch.float32).view(torch.int32)
        assert torch.equal(bits_a, bits_b)
