"""The batch-invariance workload: 64 prompts of 1 to 400 tokens, sampled, 48 new tokens.

Also a script: `python tests/engines/smollm2/workload.py OUT.json MAX_NUM_SEQS [LIMIT|-]
[EVERY] [--reverse]` runs it in a fresh process and writes the results and what the process
ran (kernel path, torch's CPU capability, threads), for the cross-process comparisons.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from rollout.determinism import seq_seed
from rollout.engines.base import GenerationRequest, GenerationResult
from rollout.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=48, logprobs=True)
NUM_PROMPTS = 64


def requests(engine, limit: int | None = None, every: int = 1) -> list[GenerationRequest]:
    """64 prompts: real text and random token ids, lengths spread over 1..400.

    With `limit`, the first `limit` prompts with 16 new tokens (a quick variant). With
    `every`, every `every`-th prompt and the longest (the batch-1 run: one sequence at a
    time is memory-bound, so it takes a subset that still spans 1..400 tokens).
    """
    text = (
        "The history of computing is long and full of surprising turns. Early machines were "
        "mechanical; later ones used relays, vacuum tubes, transistors and integrated circuits. "
    ) * 40
    base = engine.encode(text)
    rng = np.random.default_rng(2026)
    lengths = np.linspace(1, 400, NUM_PROMPTS).astype(int)
    out = []
    for i, n in enumerate(lengths):
        if i % 2:
            ids = [int(t) for t in rng.integers(3, 49152, n)]
        else:
            ids = base[i : i + n]
        out.append(GenerationRequest(str(i), ids, PARAMS, seq_seed(7, str(i), 0)))
    if every > 1:
        out = out[::every] + ([out[-1]] if (len(out) - 1) % every else [])
    if limit is not None:
        quick = PARAMS.model_copy(update={"max_tokens": 16})
        out = [
            GenerationRequest(r.request_id, r.prompt_token_ids, quick, r.seq_seed)
            for r in out[:limit]
        ]
    return out


def as_records(results: list[GenerationResult]) -> list[dict]:
    return [
        {
            "id": r.request_id,
            "tokens": r.output_token_ids,
            "logprobs": r.output_logprobs,
            "finish": r.finish_reason,
        }
        for r in results
    ]


if __name__ == "__main__":
    import torch

    from rollout.engines import create_engine
    from rollout.engines.smollm2 import kernels

    out, max_num_seqs = sys.argv[1], int(sys.argv[2])
    limit = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    every = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    reverse = "--reverse" in sys.argv
    with create_engine("smollm2", max_num_seqs=max_num_seqs) as engine:
        reqs = requests(engine, limit, every)
        results = engine.generate(reqs[::-1] if reverse else reqs)
        records = as_records(results[::-1] if reverse else results)
        # what this process actually ran, so that a test can tell a forced path took effect
        ran = {
            "kernels": kernels.path_name(),
            "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "batch_invariant": engine.fingerprint()["batch_invariant"],
        }
    with open(out, "w") as f:
        json.dump({"records": records, "ran": ran}, f)
