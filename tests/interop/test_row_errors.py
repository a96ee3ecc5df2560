"""One bad row never kills a job with on_error: skip: a prompt longer than the context, an
engine-side rejection and a scorer's error each leave their row out, listed in
errors.jsonl with its example id, stage and reason, counted in the summary; the other
rows are what a job without the bad rows writes. With on_error: fail (the default) the
job stops, naming the example id."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.errors import InputError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner

GOOD = [f"question {i}" for i in range(6)]


def job(tmp_path, rows: list[str], out: str, **over) -> dict:
    pq.write_table(pa.table({"id": [f"ex-{i}" for i in range(len(rows))], "q": rows}), tmp_path / f"{out}.parquet")  # fmt: skip
    return {"input": {"path": str(tmp_path / f"{out}.parquet")}, "prompt": {"column": "q"},
            "id_column": "id", "n": 2, "sampling": {"max_tokens": 6, "temperature": 1.0},
            "engine": {"name": "synthetic", "options": {"max_model_len": 64, "reject_text": "REJECT"}},
            "shard_size": 3, "pool": {"actors": 1, "cpus_per_actor": 0.5},
            "output": str(tmp_path / out)} | over  # fmt: skip


def read(path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((path / "data").glob("*.parquet")))


def test_skip_leaves_out_bad_rows_at_every_stage(ray_runtime, tmp_path):
    rows = [*GOOD[:2], "x" * 200, GOOD[2], "please REJECT this", *GOOD[3:], "SCORER-BOOM"]
    scoring = [{"name": "fussy", "scorer": "tests.interop.fussy:fussy"}]
    summary = JobRunner(parse_job_spec(job(tmp_path, rows, "skip", on_error="skip", scoring=scoring))).run()  # fmt: skip
    errors = [json.loads(x) for x in (tmp_path / "skip" / "errors.jsonl").read_text().splitlines()]
    by = {(e["example_id"], e["stage"]) for e in errors}
    assert by == {("ex-2", "tokenize"), ("ex-4", "generate"), ("ex-8", "score")}
    assert (
        summary.skipped_rows == len(errors) == 1 + 2 + 2
    )  # the rejected and the scorer's rows: both samples
    long = next(e for e in errors if e["stage"] == "tokenize")
    assert long["reason"].startswith("the prompt has ") and "max_model_len" in long["reason"]
    rejected = [e for e in errors if e["stage"] == "generate"]
    assert (
        sorted(e["sample_index"] for e in rejected) == [0, 1]
        and "rejected" in rejected[0]["reason"]
    )
    scorer = next(e for e in errors if e["stage"] == "score")
    assert "ValueError: cannot score this" in scorer["reason"]
    table = read(tmp_path / "skip")
    assert sorted(set(table.column("example_id").to_pylist())) == ["ex-0", "ex-1", "ex-3", "ex-5", "ex-6", "ex-7"]  # fmt: skip
    # the rows kept are those of a job that never had the bad rows (ids and seeds alike)
    clean_rows = {i: r for i, r in enumerate(rows) if i in (0, 1, 3, 5, 6, 7)}
    spec = job(tmp_path, list(clean_rows.values()), "clean")
    pq.write_table(pa.table({"id": [f"ex-{i}" for i in clean_rows], "q": list(clean_rows.values())}), tmp_path / "clean.parquet")  # fmt: skip
    JobRunner(parse_job_spec(spec | {"scoring": scoring})).run()
    clean = read(tmp_path / "clean")
    assert clean.column("row_hash").to_pylist() == table.column("row_hash").to_pylist()
    manifest = json.loads((tmp_path / "skip" / "manifest.json").read_text())
    assert sum(len(s["skipped"]) for s in manifest["shards"]) == 5


@pytest.mark.parametrize(("bad", "needle"), [
    ("x" * 200, "input row 2 (example 'ex-2'): the prompt has"),
    ("please REJECT this", "input row 2 sample 0 (example 'ex-2'): the engine rejected"),
])  # fmt: skip
def test_fail_names_the_example(ray_runtime, tmp_path, bad, needle):
    rows = [*GOOD[:2], bad, *GOOD[2:]]
    with pytest.raises(InputError) as err:
        JobRunner(parse_job_spec(job(tmp_path, rows, "fail"))).run()
    assert needle in str(err.value)
    assert not (tmp_path / "fail" / "data").exists()
