"""Determinism audits on real runs of the real model: audit, verify, repeat, and over gRPC."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rollout.api.server import Server
from rollout.audit.audit import audit_runs
from rollout.audit.render import render_html
from rollout.audit.repeat import repeat_job
from rollout.audit.report import DIVERGED, IDENTICAL, INCOMPARABLE, PositionCount
from rollout.audit.runs import RunDir
from rollout.audit.verify import Sample, verify_run
from rollout.cli.main import main
from rollout.client import RolloutClient
from rollout.errors import InputError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner

QUESTIONS = ["Name a color.", "What is 2 + 2?", "Say hi.", "Name a fruit.", "What is ice?",
             "Name a bird.", "Where is Paris?", "Count to three."]  # fmt: skip
TAMPERED = [(0, 0), (3, 1), (6, 0)]  # rows given a different token at output position 17
DELETED = (5, 1)


def spec_data(inp: Path, out: Path, **sampling) -> dict:
    return {
        "input": {"path": str(inp)},
        "prompt": {"column": "question", "chat": True},
        "id_column": "qid",
        "n": 2,
        "job_seed": 5,
        "sampling": {
            "temperature": 1.0,
            "max_tokens": 20,
            "ignore_eos": True,
            "logprobs": True,
            **sampling,
        },  # fmt: skip
        "engine": {"name": "smollm2", "options": {"max_num_seqs": 16}},
        "shard_size": 3,
        "output": str(out),
    }


@pytest.fixture(scope="module")
def runs(ray_runtime, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audit")
    inp = root / "in.parquet"
    rows = [{"qid": f"q{i}", "question": q} for i, q in enumerate(QUESTIONS)]
    pq.write_table(pa.Table.from_pylist(rows), inp)
    out = {}
    for name, shard_size, sampling in (
        ("a", 3, {}),
        ("b", 5, {}),
        ("t07", 3, {"temperature": 0.7}),
    ):
        data = spec_data(inp, root / name, **sampling)
        data["shard_size"] = shard_size
        JobRunner(parse_job_spec(data)).run()
        out[name] = root / name
    out["input"], out["root"] = inp, root
    out["tampered"] = tamper(out["b"], root / "tampered")
    return out


def tamper(run: Path, to: Path) -> Path:
    """A copy of `run` with TAMPERED rows changed at position 17 and DELETED removed
    (stored hashes left as they were, as a careless edit would)."""
    shutil.copytree(run, to)
    for path in sorted((to / "data").glob("*.parquet")):
        table = pq.read_table(path)
        rows = []
        for r in table.to_pylist():
            key = (r["row_index"], r["sample_index"])
            if key == DELETED:
                continue
            if key in TAMPERED:
                r["output_token_ids"][17] = (r["output_token_ids"][17] + 1) % 49152
            rows.append(r)
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    return to


def test_two_runs_of_one_config_are_identical(runs, capsys):
    report = audit_runs(RunDir(runs["a"]), RunDir(runs["b"]))
    assert report.verdict == IDENTICAL and report.exit_code == 0
    assert (report.compared, report.identical, report.differing) == (16, 16, 0)
    assert report.a.run_digest == report.b.run_digest and report.config_diff == []
    assert main(["audit", str(runs["a"]), str(runs["b"]), "--json", "--quiet"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "IDENTICAL" and data["compared"] == 16


def test_tampered_rows_are_found_at_position_17(runs, tmp_path, capsys):
    html = tmp_path / "report.html"
    code = main(["audit", str(runs["a"]), str(runs["tampered"]), "--report", str(html), "--quiet"])
    assert code == 1
    text = capsys.readouterr().out
    assert "verdict: DIVERGED" in text and "first divergence at output position: 17 x3" in text

    report = audit_runs(RunDir(runs["a"]), RunDir(runs["tampered"]))
    assert report.verdict == DIVERGED
    assert [(d.row_index, d.sample_index) for d in report.divergences] == TAMPERED
    assert all(d.position == 17 and d.kind == "tokens" for d in report.divergences)
    assert all(d.token_b == (d.token_a + 1) % 49152 for d in report.divergences)
    assert all(not d.prompt_differs and d.logprob_a is not None for d in report.divergences)
    assert all(
        d.text_a is not None and len(d.text_a) == len(d.context_a) for d in report.divergences
    )
    assert report.first_divergence == [PositionCount(17, 3)]
    assert (report.compared, report.differing, report.missing_in_a, report.missing_in_b) == (
        15,
        3,
        0,
        1,
    )
    assert [(m.row_index, m.sample_index) for m in report.missing] == [DELETED]
    # the edited rows no longer match their stored hashes: flagged as well
    assert report.inconsistent_b == 3 and report.inconsistent_a == 0

    page = html.read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and "DIVERGED" in page and "<svg" in page
    assert page.count('class="div"') >= 6  # the divergence highlighted on both sides of 3 pairs
    assert "<script" not in page and "http" not in page  # one self-contained file
    assert render_html(report).count("<tr><td>") == 3


def test_different_temperature_is_incomparable_and_names_the_field(runs, capsys):
    code = main(["audit", str(runs["a"]), str(runs["t07"]), "--json", "--quiet"])
    assert code == 3
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == INCOMPARABLE
    assert [(d["path"], d["a"], d["b"]) for d in data["config_diff"]] == [
        ("sampling.temperature", 1.0, 0.7)
    ]
    assert data["compared"] == 16  # the shared rows are still compared
    assert data["differing"] > 0


def test_verify_untouched_and_tampered(runs, capsys):
    assert main(["verify", str(runs["a"]), "--rows", "10", "--seed", "1", "--json", "--quiet"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == IDENTICAL and data["compared"] == 10 and data["b"]["rows"] == 10

    report = verify_run(RunDir(runs["tampered"]), Sample(fraction=1.0))
    assert report.verdict == DIVERGED
    assert [(d.row_index, d.sample_index) for d in report.divergences] == TAMPERED
    assert all(d.position == 17 for d in report.divergences)
    assert report.missing_in_a == 1  # the manifest lists 16 rows, the files hold 15
    assert report.inconsistent_a == 3 and report.compared == 15


def test_verify_sample_is_deterministic(runs):
    from rollout.audit.verify import plan_sample

    first = plan_sample(RunDir(runs["a"]), Sample(rows=5, seed=9)).codes.tolist()
    again = plan_sample(RunDir(runs["a"]), Sample(rows=5, seed=9)).codes.tolist()
    other = plan_sample(RunDir(runs["a"]), Sample(rows=5, seed=10)).codes.tolist()
    assert first == again and len(first) == 5 and first != other
    with pytest.raises(Exception, match="sample"):
        Sample(fraction=1.5).count(16)


def test_repeat_across_topologies_gives_one_digest(runs, tmp_path):
    small = tmp_path / "small.parquet"
    pq.write_table(pa.table({"qid": ["r0", "r1", "r2", "r3"], "question": QUESTIONS[:4]}), small)
    spec = parse_job_spec(spec_data(small, tmp_path / "unused", max_tokens=8))
    report = repeat_job(spec, 3, ("actors", "shard_size"), tmp_path / "rep")
    assert [(r.actors, r.shard_size) for r in report.runs] == [(1, 3), (2, 1), (1, 6)]
    assert report.distinct_run_digests == 1 and report.verdict == IDENTICAL
    assert report.outputs_per_row == {1: 8} and report.rows == 8
    assert spec.sampling.temperature == 1.0


def test_audit_errors_name_the_run(runs, tmp_path):
    with pytest.raises(InputError, match="holds no manifest.json"):
        RunDir(tmp_path)
    unfinished = tmp_path / "unfinished"
    shutil.copytree(runs["a"], unfinished)
    manifest = json.loads((unfinished / "manifest.json").read_text())
    manifest["status"] = "running"
    (unfinished / "manifest.json").write_text(json.dumps(manifest))
    assert main(["audit", str(runs["a"]), str(unfinished)]) == 2


def test_audit_and_verify_over_grpc(runs, tmp_path):
    server = Server("127.0.0.1:0", tmp_path / "state", [runs["root"]])
    server.start()
    try:
        with RolloutClient(f"127.0.0.1:{server.port}") as client:
            seen = []
            report = client.audit(str(runs["a"]), str(runs["tampered"]),
                                  progress=lambda *p: seen.append(p))  # fmt: skip
            assert report.verdict == DIVERGED and report.first_divergence == [PositionCount(17, 3)]
            assert [(d.row_index, d.sample_index) for d in report.divergences] == TAMPERED
            assert seen and seen[-1][0] == "compare"
            report = client.verify("a", rows=4, seed=2)  # relative to the data root
            assert report.verdict == IDENTICAL and report.compared == 4
            with pytest.raises(grpc.RpcError) as err:
                client.audit(str(runs["a"]), str(tmp_path))
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError) as err:
                client.verify("a", sample=2.0)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "sample" in err.value.details()
            assert client.health() == "SERVING"
    finally:
        server.stop()


def test_repeat_cli(runs, tmp_path, capsys):
    """The command as a user runs it (the synthetic engine: the CLI path, not the model)."""
    config = tmp_path / "job.yaml"
    data = spec_data(runs["input"], tmp_path / "o")
    data["engine"] = {"name": "synthetic", "options": {"max_num_seqs": 16}}
    config.write_text(yaml.safe_dump(data))
    code = main(["repeat", str(config), "--times", "3", "--vary", "batch_size,shard_size", "--json",
                 "--out", str(tmp_path / "rep")])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["distinct_run_digests"] == 1 and out["outputs_per_row"] == {"1": 16}
    assert [(r["batch_size"], r["shard_size"]) for r in out["runs"]] == [(16, 3), (8, 1), (4, 6)]
    assert main(["repeat", str(config), "--vary", "colour"]) == 2
    assert main(["repeat", str(config), "--out", str(tmp_path / "rep")]) == 2  # not empty
