#!/usr/bin/env python
"""Acceptance checks for a first real DeepInfer node (8xB300): one command, and a report to
paste into an issue.

    python scripts/deepinfer_acceptance.py --model /models/DeepSeek-V4.1-Flash-1017

Each check says PASS or FAIL and what it saw:
  1. canary: 2 chat prompts, twice (the second time in reverse order): the same tokens and
     logprob bits; the answer about the capital of France names Paris;
  2. rank 0 vs rank 7: one request served alone (rank 0) and as the 8th of 8 (rank 7,
     requests go round robin): the same bits (unstated by DeepInfer; this is the test);
  3. batch 1 vs 64 vs 512 requests, shuffled: every request's bits the same in all three;
  4. a 1,000-row job twice, with other shard sizes: one run digest, and `rollout audit`
     IDENTICAL.
The report (Markdown: the node, the engine fingerprint, each check, timings) is printed and
written to OUT/report.md. --ranks, --gpus-per-engine and the sizes shrink it for a smaller
node (the test suite runs it against the stand-in that way). Exit code 0 only if all pass.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rollout import determinism
from rollout.engines import GenerationRequest, create_engine
from rollout.sampling_params import SamplingParams

WORDS = ["river", "stone", "cloud", "garden", "engine", "letter", "mountain", "window", "paper", "signal", "market", "forest", "number", "winter", "silver", "orange", "bridge", "animal", "doctor", "planet", "music", "ocean"]  # fmt: skip


def _bits(result) -> tuple:
    lps = [float(x) for x in (result.output_logprobs or [])]
    return (tuple(result.output_token_ids), tuple(lps), result.finish_reason)


def _prompt(i: int) -> str:
    rng = random.Random(i)
    return "Write one sentence about " + " and ".join(rng.sample(WORDS, 1 + i % 4)) + "."


class Checks:
    def __init__(self) -> None:
        self.rows: list[tuple[str, bool, str, float]] = []

    def record(self, name: str, ok: bool, detail: str, started: float) -> None:
        self.rows.append((name, ok, detail, time.monotonic() - started))
        print(
            f"[acceptance] {'PASS' if ok else 'FAIL'} {name}: {detail}", file=sys.stderr, flush=True
        )

    @property
    def passed(self) -> bool:
        return bool(self.rows) and all(ok for _, ok, _, _ in self.rows)


def run(args: argparse.Namespace) -> int:
    from rollout.audit.audit import audit_runs
    from rollout.audit.runs import RunDir
    from rollout.jobs.spec import parse_job_spec
    from rollout.runtime import cluster
    from rollout.runtime.runner import JobRunner

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cluster.connect(args.ray_address)
    options = {"model": args.model, "engines_per_replica": args.ranks,
               "gpus_per_engine": args.gpus_per_engine, "cpus_per_engine": args.cpus_per_engine,
               "max_model_len": args.max_model_len}  # fmt: skip
    checks = Checks()
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=args.max_tokens, logprobs=True)
    engine = create_engine("deepinfer", **options)
    started = time.monotonic()
    engine.start()
    start_s = time.monotonic() - started
    fingerprint = engine.fingerprint()
    try:
        # 1. canary
        t = time.monotonic()
        texts = ["What is the capital of France? Answer in one word.", "Name a prime number."]
        reqs = [GenerationRequest(str(i), engine.encode(engine.apply_chat_template([{"role": "user", "content": x}])),
                                  params, determinism.seq_seed(1, str(i), 0)) for i, x in enumerate(texts)]  # fmt: skip
        first = engine.generate(reqs)
        again = engine.generate(reqs[::-1])[::-1]
        same = [_bits(a) for a in first] == [_bits(b) for b in again]
        paris = "paris" in first[0].output_text.lower()
        ok = same and (paris or not args.expect_paris)
        checks.record(
            "canary", ok, f"repeat identical: {same}; answer: {first[0].output_text[:60]!r}", t
        )

        # 2. rank 0 vs rank (ranks - 1)
        t = time.monotonic()
        probe = GenerationRequest("probe", engine.encode(_prompt(7)), params, determinism.seq_seed(2, "probe", 0))  # fmt: skip
        fillers = [GenerationRequest(f"f{i}", engine.encode(_prompt(100 + i)), params, i) for i in range(args.ranks - 1)]  # fmt: skip
        alone = engine.generate([probe])[0]
        last = engine.generate([*fillers, probe])[-1]
        checks.record(f"rank 0 vs rank {args.ranks - 1}", _bits(alone) == _bits(last),
                      f"{len(alone.output_token_ids)} tokens, bits equal: {_bits(alone) == _bits(last)}", t)  # fmt: skip

        # 3. batch 1 vs 64 vs 512, shuffled
        t = time.monotonic()
        big, mid, small = args.batch_sizes
        pool = [GenerationRequest(str(i), engine.encode(_prompt(i)), params, determinism.seq_seed(3, str(i), 0))
                for i in range(big)]  # fmt: skip
        shuffled = pool[:]
        random.Random(0).shuffle(shuffled)
        by_id = {r.request_id: _bits(r) for r in engine.generate(shuffled)}
        mid_ids = {r.request_id: _bits(r) for r in engine.generate(shuffled[:mid][::-1])}
        singles = {r.request_id: _bits(engine.generate([r])[0]) for r in shuffled[:small]}
        differ = [k for k, v in {**mid_ids, **singles}.items() if by_id[k] != v]
        checks.record(f"batch {small}x1 vs {mid} vs {big}, shuffled", not differ,
                      f"{len(mid_ids) + len(singles)} compared, {len(differ)} differ {differ[:5]}", t)  # fmt: skip
    finally:
        engine.close()

    # 4. a job twice, other shard sizes: one digest, audit IDENTICAL
    t = time.monotonic()
    inp = out / "input.parquet"
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(args.rows)],
                             "q": [_prompt(i) for i in range(args.rows)]}), inp)  # fmt: skip
    summaries = []
    for name, shard in (("run-a", 100), ("run-b", 37)):
        spec = {"input": {"path": str(inp)}, "prompt": {"column": "q", "chat": True}, "id_column": "id",
                "job_seed": 5, "sampling": params.model_dump(exclude_defaults=True),
                "engine": {"name": "deepinfer", "options": options},
                "pool": {"actors": 1, "cpus_per_actor": args.cpus_per_engine}, "shard_size": shard,
                "output": str(out / name)}  # fmt: skip
        summaries.append(JobRunner(parse_job_spec(spec)).run())
    report = audit_runs(RunDir(out / "run-a"), RunDir(out / "run-b"), decode=False)
    same = summaries[0].run_digest == summaries[1].run_digest
    checks.record(f"{args.rows}-row job twice", same and report.verdict == "IDENTICAL",
                  f"digests {summaries[0].run_digest[:16]} / {summaries[1].run_digest[:16]}, audit {report.verdict}", t)  # fmt: skip

    text = _report(checks, fingerprint, start_s, summaries[0])
    (out / "report.md").write_text(text)
    print(text)
    return 0 if checks.passed else 1


def _report(checks: Checks, fingerprint: dict, start_s: float, job) -> str:
    lines = [
        "## DeepInfer acceptance (`scripts/deepinfer_acceptance.py`)",
        "",
        f"- verdict: **{'PASS' if checks.passed else 'FAIL'}**",
        f"- GPUs: {', '.join(fingerprint.get('gpu', []))}; driver {', '.join(fingerprint.get('driver', []))}",
        f"- replica start: {start_s:.0f} s; job: {job.rows} rows, {job.output_tokens_per_s:.0f} output tokens/s",
        "",
        "| check | result | seen | seconds |",
        "| --- | --- | --- | ---: |",
        *[f"| {n} | {'PASS' if ok else 'FAIL'} | {d} | {s:.1f} |" for n, ok, d, s in checks.rows],
        "",
        "<details><summary>engine fingerprint</summary>",
        "",
        "```json",
        json.dumps(fingerprint, indent=1, sort_keys=True),
        "```",
        "</details>",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the DeepSeek-V4.1-Flash folder")
    ap.add_argument("--out", default="deepinfer-acceptance", help="where runs and report.md go")
    ap.add_argument("--ranks", type=int, default=8, help="engines in the replica (8 on 8xB300)")
    ap.add_argument("--gpus-per-engine", type=float, default=1.0)
    ap.add_argument("--cpus-per-engine", type=float, default=1.0)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rows", type=int, default=1000, help="rows of the job run twice")
    ap.add_argument("--batch-sizes", type=lambda s: tuple(int(x) for x in s.split(",")),
                    default=(512, 64, 8), help="BIG,MID,SINGLES: requests in the three calls")  # fmt: skip
    ap.add_argument("--ray-address", default=None)
    ap.add_argument("--no-expect-paris", dest="expect_paris", action="store_false",
                    help="a stand-in engine cannot answer: do not require 'Paris'")  # fmt: skip
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
