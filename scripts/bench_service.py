#!/usr/bin/env python
"""Service overhead, side by side in one run (issue [2/7]).

The same 64 chat prompts x 64 new tokens (EOS ignored, temperature 0.8, top_p 0.95):
  (a) generated directly by one smollm2 engine object in this process;
  (b) by a rollout job with one actor (Ray, Parquet in, Parquet out, seeds, hashes,
      manifest), timed from the moment its engine is ready to the finished run.
Model load is excluded from both and reported apart. Prints Markdown; `--write FILE`
replaces the service section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from rollout.determinism import seq_seed  # noqa: E402
from rollout.engines import GenerationRequest, create_engine  # noqa: E402
from rollout.jobs.spec import parse_job_spec  # noqa: E402
from rollout.runtime.runner import JobRunner  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from bench_engine import PROMPTS as ENGINE_PROMPTS  # noqa: E402
from benchlib import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOKENS = 64
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "max_tokens": TOKENS, "ignore_eos": True}
ENGINE_OPTIONS = {"max_num_seqs": 64}


def prompts() -> list[list[dict]]:
    demo = [
        json.loads(line)["messages"]
        for line in (ROOT / "data/demo/prompts.jsonl").read_text().splitlines()
    ]
    extra = [[{"role": "user", "content": p}] for p in ENGINE_PROMPTS]
    return (demo + extra)[:64]


class Clock:
    def start(self, manifest) -> None:
        self.t0 = time.perf_counter()

    def shard_done(self, result, manifest) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    conversations = prompts()

    t = time.perf_counter()
    engine = create_engine("smollm2", **ENGINE_OPTIONS)
    engine.start()
    load_a = time.perf_counter() - t
    from rollout.sampling_params import SamplingParams

    params = SamplingParams(**SAMPLING)
    reqs = [
        GenerationRequest(
            str(i), engine.encode(engine.apply_chat_template(m)), params, seq_seed(0, str(i), 0)
        )
        for i, m in enumerate(conversations)
    ]
    t = time.perf_counter()
    results = engine.generate(reqs)
    seconds_a = time.perf_counter() - t
    tokens_a = sum(len(r.output_token_ids) for r in results)
    engine.close()

    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(
            pa.Table.from_pylist([{"messages": m} for m in conversations]), f"{tmp}/in.parquet"
        )
        spec = parse_job_spec({
            "input": {"path": f"{tmp}/in.parquet"},
            "prompt": {"messages_column": "messages"},
            "sampling": SAMPLING,
            "engine": {"name": "smollm2", "options": ENGINE_OPTIONS},
            "pool": {"actors": 1, "cpus_per_actor": 2},
            "shard_size": 64,
            "output": f"{tmp}/run",
        })  # fmt: skip
        clock = Clock()
        t = time.perf_counter()
        summary = JobRunner(spec, progress=clock).run()
        end = time.perf_counter()
        seconds_b = end - clock.t0
        startup_b = clock.t0 - t
        same = [r.output_token_ids for r in results] == [
            row["output_token_ids"]
            for row in pq.read_table(f"{tmp}/run/data", columns=["output_token_ids"]).to_pylist()
        ]
    rate_a, rate_b = tokens_a / seconds_a, summary.output_tokens / seconds_b
    lines = [
        "## Service overhead: engine vs `rollout run` (`scripts/bench_service.py`)",
        "",
        f"64 chat prompts x {TOKENS} new tokens, EOS ignored, temperature 0.8, top_p 0.95, "
        "`max_num_seqs` 64; one engine in-process vs a job with one actor (2 CPUs) and one 64-row shard "
        "(Ray, Parquet in and out, seeds, hashes, manifest). Measured in one run, side by side.",
        "",
        "| run | output tokens | seconds | output tokens/s |",
        "| --- | ---: | ---: | ---: |",
        f"| (a) engine object, in-process | {tokens_a} | {seconds_a:.1f} | {rate_a:.1f} |",
        f"| (b) `rollout run`, 1 actor | {summary.output_tokens} | {seconds_b:.1f} | {rate_b:.1f} |",
        "",
        f"- **ratio b/a: {rate_b / rate_a:.3f}** (target >= 0.95)",
        f"- identical output tokens in (a) and (b): **{same}** (both derive each seed from example id = row index and job seed 0)",
        f"- excluded above: engine load {load_a:.1f} s in (a); Ray start plus actor and engine start {startup_b:.1f} s in (b)",
        "",
    ]
    publish("\n".join(lines), args.write)


if __name__ == "__main__":
    main()
