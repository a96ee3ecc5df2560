"""The synthetic engine through the real pipeline: determinism, a flat driver, straggler backups."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from rollout.engines import GenerationRequest, create_engine
from rollout.jobs.spec import parse_job_spec
from rollout.procstat import run_cli_measured
from rollout.runtime.manifest import Manifest
from rollout.runtime.runner import JobRunner
from rollout.sampling_params import SamplingParams
from tests.runtime.conftest import independent_run_digest


def write_prompts(path: Path, rows: int) -> Path:
    pq.write_table(pa.table({"q": [f"Write about topic {i}." for i in range(rows)]}), path,
                   row_group_size=50_000)  # fmt: skip
    return path


def spec(inp: Path, out: Path, **over) -> dict:
    data = {
        "input": {"path": str(inp)},
        "prompt": {"column": "q"},
        "n": 2,
        "job_seed": 3,
        "sampling": {"temperature": 1.0, "max_tokens": 25, "logprobs": True, "stop": ["w12"]},
        "engine": {"name": "synthetic", "options": {"mean_output_len": 20}},
        "pool": {"actors": 1, "cpus_per_actor": 0.5},
        "shard_size": 50,
        "output": str(out),
    }
    data.update(over)
    return data


def test_synthetic_engine_is_batch_and_order_invariant():
    engine = create_engine("synthetic", output_len="geometric", mean_output_len=30)
    engine.start()
    params = SamplingParams(temperature=0.7, max_tokens=80, logprobs=True, top_logprobs=2)
    reqs = [
        GenerationRequest(str(i), engine.encode(f"prompt {i}"), params, 1000 + i) for i in range(40)
    ]
    alone = [engine.generate([r])[0] for r in reqs]
    together = engine.generate(reqs[::-1])[::-1]
    assert [
        (a.output_token_ids, a.output_logprobs, a.top_logprobs, a.finish_reason) for a in alone
    ] == [
        (b.output_token_ids, b.output_logprobs, b.top_logprobs, b.finish_reason) for b in together
    ]
    assert {a.finish_reason for a in alone} == {"stop", "length"}
    assert engine.decode(engine.encode("héllo")) == "héllo"


def test_synthetic_digest_is_the_same_for_1_and_3_actors(ray_runtime, tmp_path):
    inp = write_prompts(tmp_path / "in.parquet", 300)
    one = JobRunner(parse_job_spec(spec(inp, tmp_path / "one"))).run()
    three = JobRunner(parse_job_spec(spec(inp, tmp_path / "three", shard_size=37,
                                          pool={"actors": 3, "cpus_per_actor": 0.5}))).run()  # fmt: skip
    assert one.run_digest == three.run_digest and one.rows == 600
    assert one.actor_cpu_s > 0 and three.actor_cpu_s > 0  # the actors report their CPU time
    digest, rows = independent_run_digest(tmp_path / "three")
    assert digest == one.run_digest
    assert {r["finish_reason"] for r in rows} == {"stop", "length"}


def driver_peak_mib(config: Path) -> tuple[dict, float]:
    proc, peak = run_cli_measured("run", str(config), "--quiet", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the summary is the last JSON line (Ray may print its own lines to stdout too)
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1]), peak


def test_driver_memory_stays_flat_from_50k_to_200k_rows(tmp_path):
    """The driver (the `rollout run` process, not its actors) at 50k and at 200k rows."""
    peaks = {}
    for rows in (50_000, 200_000):
        inp = write_prompts(tmp_path / f"in{rows}.parquet", rows)
        data = spec(inp, tmp_path / f"out{rows}", n=1, shard_size=5_000)
        data["sampling"] = {"max_tokens": 16, "ignore_eos": True}
        data["pool"] = {"actors": 2, "cpus_per_actor": 1}
        config = tmp_path / f"job{rows}.yaml"
        config.write_text(yaml.safe_dump(data))
        summary, peaks[rows] = driver_peak_mib(config)
        assert summary["rows"] == rows
        manifest = Manifest.load(tmp_path / f"out{rows}")
        assert manifest.rows == rows and manifest.status == "complete"
    # 4x the rows: the driver holds per-shard state only (generous bound for allocator noise)
    assert peaks[200_000] - peaks[50_000] < 40, peaks


def test_a_backup_copy_of_a_straggler_never_doubles_a_row(ray_runtime, tmp_path):
    inp = write_prompts(tmp_path / "in.parquet", 240)
    data = spec(inp, tmp_path / "slow", shard_size=20)
    data["engine"]["options"] = {"mean_output_len": 20, "tokens_per_s": 4000,
                                 "slow_claim_file": str(tmp_path / "slow.claim"), "slow_factor": 30}  # fmt: skip
    data["pool"] = {"actors": 2, "cpus_per_actor": 0.5, "backup_after": 2.0, "backup_min_s": 0.2}
    slow = JobRunner(parse_job_spec(data)).run()
    assert (tmp_path / "slow.claim").exists()  # one replica was the straggler
    assert slow.backup_copies >= 1
    clean = JobRunner(parse_job_spec(spec(inp, tmp_path / "clean", shard_size=20))).run()
    assert slow.run_digest == clean.run_digest
    digest, rows = independent_run_digest(tmp_path / "slow")
    keys = [(r["row_index"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 480 and digest == clean.run_digest
    data_dir = tmp_path / "slow" / "data"
    assert sorted(p.name for p in data_dir.iterdir()) == [
        f"part-{i:06d}.parquet" for i in range(12)
    ]
    assert not re.search("tmp", " ".join(p.name for p in data_dir.iterdir()))


def test_journal_records_shards_between_snapshots(ray_runtime, tmp_path):
    """Shards recorded in shards.jsonl after the last snapshot count on load and on resume;
    a line cut short by a crash does not."""
    from tests.runtime.test_jobs import StopAfter

    inp = write_prompts(tmp_path / "in.parquet", 200)
    job = parse_job_spec(spec(inp, tmp_path / "out"))
    with pytest.raises(KeyboardInterrupt):
        JobRunner(job, progress=StopAfter(2)).run()
    out = tmp_path / "out"
    before = Manifest.load(out)
    assert not (out / "shards.jsonl").exists()  # a stopped run folds its journal into the snapshot
    done = [e for e in before.shards if e.complete]
    assert len(done) >= 2
    # As a crash would leave it: one more shard recorded in the journal only, and a torn line.
    extra = tmp_path / "extra"
    finished = JobRunner(parse_job_spec(spec(inp, extra))).run()
    assert finished.rows == 400
    full = Manifest.load(extra)
    entry = next(e for e in full.shards if e.shard_id == len(done))
    staged = out / ".incomplete" / entry.file
    staged.write_bytes((extra / "data" / entry.file).read_bytes())
    Manifest.record(out, [entry])
    with open(out / "shards.jsonl", "a") as f:
        f.write('{"shard_id": 3, "rows"')  # torn
    assert Manifest.load(out).done == len(done) + 1
    resumed = JobRunner(job).run()
    assert resumed.shards_resumed == len(done) + 1
    assert resumed.run_digest == finished.run_digest
    assert not (out / "shards.jsonl").exists()  # folded into the final manifest
