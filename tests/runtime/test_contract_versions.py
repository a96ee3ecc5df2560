"""Determinism contract v2 in runs: the digest vouches for logprobs; v1 runs still read,
resume (as v1) and audit against v2 runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rollout import determinism
from rollout.audit.audit import audit_runs
from rollout.audit.runs import Rows, RunDir, list_batches, verify_shard_file
from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner
from tests.runtime.conftest import independent_run_digest


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("input") / "prompts.parquet"
    pq.write_table(pa.table({"q": [f"question number {i}" for i in range(30)]}), path)
    return path


def spec(prompts: Path, out: Path, **over):
    data = {
        "input": {"path": str(prompts)},
        "prompt": {"column": "q"},
        "n": 2,
        "job_seed": 11,
        "sampling": {"temperature": 1.0, "max_tokens": 12, "logprobs": True, "top_logprobs": 2},
        "engine": {
            "name": "synthetic",
            "options": {"mean_output_len": 8, "output_len": "uniform"},
        },  # fmt: skip
        "pool": {"actors": 1, "cpus_per_actor": 0.5},
        "shard_size": 8,
        "output": str(out),
    } | over
    return parse_job_spec(data)


@pytest.fixture(scope="module")
def v2_run(ray_runtime, prompts, tmp_path_factory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("runs") / "v2"
    return out, JobRunner(spec(prompts, out)).run()


@pytest.fixture(scope="module")
def v1_run(ray_runtime, prompts, tmp_path_factory) -> tuple[Path, object]:
    """A run as a rollout from before v2 wrote it: v1 hashes, no `determinism` in the manifest."""
    out = tmp_path_factory.mktemp("runs") / "v1"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(determinism, "CURRENT_VERSION", "v1")
        summary = JobRunner(spec(prompts, out)).run()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest.pop("determinism") == "v1"
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out, summary


def test_new_runs_are_v2_and_the_digest_covers_logprobs(v2_run):
    out, summary = v2_run
    assert json.loads((out / "manifest.json").read_text())["determinism"] == "v2"
    digest, rows = independent_run_digest(out)  # struct + hashlib, v2 formulas
    assert digest == summary.run_digest
    assert all(len(r["output_logprobs"]) == len(r["output_token_ids"]) for r in rows)
    assert all(len(pos) == 2 for r in rows for pos in r["top_logprobs"])

    # one logprob's last bit flipped: the tokens are the same, the row no longer verifies
    shard = out / "data" / "part-000000.parquet"
    table = pq.read_table(shard)
    lps = table.column("output_logprobs").combine_chunks()
    values = lps.values.to_numpy().copy()
    values.view("uint32")[3] ^= 1
    changed = pa.ListArray.from_arrays(lps.offsets, pa.array(values, pa.float32()))
    tampered = out.parent / "tampered.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("output_logprobs"),
                                    "output_logprobs", changed), tampered)  # fmt: skip
    assert (
        verify_shard_file(shard, "v2")[0]
        == json.loads((out / "manifest.json").read_text())["shards"][0]["shard_digest"]
    )
    with pytest.raises(ValueError, match="does not match its hashes"):
        verify_shard_file(tampered, "v2")
    # v1 row hashes do not see the change (what v2 was made for); v2 ones see that row only
    v1 = [row_hashes(p, "v1") for p in (shard, tampered)]
    v2 = [row_hashes(p, "v2") for p in (shard, tampered)]
    assert v1[0] == v1[1]
    flipped_row = int(np.searchsorted(lps.offsets.to_numpy(), 3, side="right")) - 1
    assert [i for i, (a, b) in enumerate(zip(*v2, strict=True)) if a != b] == [flipped_row]


def row_hashes(path: Path, version: str) -> list[str]:
    return [h for batch in list_batches(path) for h in Rows(batch, version).row_hash]


def test_a_v1_run_reads_with_v1_formulas(v1_run, v2_run):
    out, summary = v1_run
    digest, _ = independent_run_digest(out)  # the manifest has no version: v1
    assert digest == summary.run_digest
    run = RunDir(out)
    assert run.determinism == "v1"
    assert all(rows.consistent[i] for _, rows, i in run.rows())
    assert summary.run_digest != v2_run[1].run_digest  # other formulas, other digest


def test_a_v1_run_audits_against_a_v2_run_row_by_row(v1_run, v2_run):
    report = audit_runs(RunDir(v1_run[0]), RunDir(v2_run[0]), decode=False)
    assert report.config_equal  # config_hash did not change in v2
    assert report.verdict == "IDENTICAL" and report.compared == report.identical == 60
    assert (report.a.determinism, report.b.determinism) == ("v1", "v2")
    assert report.notes and "not comparable" in report.notes[0]


def test_an_unfinished_v1_run_resumes_as_v1(v1_run, prompts, tmp_path):
    """Cut the finished v1 run back to an unfinished one (shard 2 lost); the current rollout
    resumes it with v1 hashes and reaches the v1 digest."""
    src, summary = v1_run
    out = tmp_path / "v1-unfinished"
    shutil.copytree(src, out)
    (out / "data").rename(out / ".incomplete")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.update(status="running", run_digest=None, rows=None)
    lost = manifest["shards"][2]
    lost.update(complete=False, rows=None, shard_digest=None, file_sha256=None)
    (out / ".incomplete" / lost["file"]).unlink()
    (out / "manifest.json").write_text(json.dumps(manifest))

    resumed = JobRunner(spec(prompts, out)).run()
    assert resumed.shards_resumed == len(manifest["shards"]) - 1
    assert resumed.run_digest == summary.run_digest
    final = json.loads((out / "manifest.json").read_text())
    assert final.get("determinism", "v1") == "v1"
    regenerated = pq.read_table(out / "data" / lost["file"])
    assert pc.all(pc.equal(regenerated.column("row_hash"),
                           pq.read_table(src / "data" / lost["file"]).column("row_hash"))).as_py()  # fmt: skip
