"""`rollout run` as a user runs it: a subprocess that starts its own Ray runtime."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rollout(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rollout.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
    )


def test_run_prints_summary_and_resumes_to_the_same_digest(tmp_path: Path):
    lines = [json.loads(x) for x in (ROOT / "data/demo/prompts.jsonl").read_text().splitlines()[:5]]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "job.yaml").write_text(
        "input: {path: in.jsonl}\n"
        "prompt: {messages_column: messages}\n"
        "id_column: id\n"
        "n: 2\n"
        "sampling: {temperature: 0.7, max_tokens: 5}\n"
        "pool: {actors: 1}\n"
        "output: out\n"
    )
    first = rollout("run", "job.yaml", "--json", "--quiet", "--shard-size", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    summary = json.loads(first.stdout)
    assert (summary["rows"], summary["shards"], summary["input_rows"]) == (10, 3, 5)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["run_digest"] == summary["run_digest"] and manifest["status"] == "complete"
    # Running it again verifies every shard and regenerates nothing.
    again = rollout("run", "job.yaml", "--json", "--quiet", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    second = json.loads(again.stdout)
    assert second["run_digest"] == summary["run_digest"] and second["shards_resumed"] == 3
    text = rollout("run", "job.yaml", "--quiet", cwd=tmp_path)
    assert f"run_digest: {summary['run_digest']}" in text.stdout and "/out/data" in text.stdout


def test_run_bad_config_exits_2_naming_the_field(tmp_path: Path):
    (tmp_path / "job.yaml").write_text(
        "input: {path: x.parquet}\nprompt: {column: q}\nsampling: {temperature: -1}\n"
    )
    out = rollout("run", "job.yaml", cwd=tmp_path)
    assert out.returncode == 2
    assert (
        "invalid sampling.temperature: temperature must be a finite number >= 0, got -1"
        in out.stderr
    )
    (tmp_path / "ok.yaml").write_text("input: {path: x.parquet}\nprompt: {column: q}\n")
    out = rollout("run", "ok.yaml", "--actors", "0", cwd=tmp_path)
    assert (
        out.returncode == 2
        and "invalid pool.actors: Input should be greater than or equal to 1" in out.stderr
    )
    out = rollout("run", "ok.yaml", cwd=tmp_path)
    assert (
        out.returncode == 2
        and "x.parquet" in out.stderr
        and "no such file or directory" in out.stderr
    )
