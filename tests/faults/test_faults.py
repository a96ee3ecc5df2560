"""Fault injection on real processes: each case ends with the digest of an undisturbed run
and every (row_index, sample_index) exactly once (rollout/runtime/faults.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.errors import OutputError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime import faults
from rollout.runtime.manifest import Manifest
from rollout.runtime.runner import JobRunner
from tests.runtime.conftest import independent_run_digest

ROWS, SHARD = 60, 10


@pytest.fixture(scope="module")
def inp(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "in.parquet"
    pq.write_table(pa.table({"q": [f"Question {i}?" for i in range(ROWS)]}), path)
    return path


def job(inp: Path, out: Path) -> dict:
    return {
        "input": {"path": str(inp)},
        "prompt": {"column": "q"},
        "n": 2,
        "job_seed": 17,
        "sampling": {"temperature": 0.9, "max_tokens": 12, "logprobs": True},
        "engine": {"name": "synthetic", "options": {"mean_output_len": 8}},
        "pool": {"actors": 2, "cpus_per_actor": 0.5},
        "shard_size": SHARD,
        "output": str(out),
    }


@pytest.fixture(scope="module")
def clean_digest(ray_runtime, inp, tmp_path_factory) -> str:
    return (
        JobRunner(parse_job_spec(job(inp, tmp_path_factory.mktemp("clean") / "run")))
        .run()
        .run_digest
    )


def exactly_once(run: Path, digest: str) -> None:
    got, rows = independent_run_digest(run)
    keys = [(r["row_index"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * ROWS
    assert got == digest


@pytest.mark.parametrize(
    "point", ["before_first_row", "mid_generation", "during_write", "after_write", "after_record"]
)
def test_actor_killed_at_each_point_of_a_shard(
    ray_runtime, inp, clean_digest, tmp_path, monkeypatch, point
):
    marker = tmp_path / "fired"
    monkeypatch.setenv(faults.ENV, f"{point}:2:{marker}")
    summary = JobRunner(parse_job_spec(job(inp, tmp_path / "run"))).run()
    assert marker.exists(), "the fault did not fire"
    assert summary.actor_restarts == 1
    assert summary.run_digest == clean_digest
    exactly_once(tmp_path / "run", clean_digest)
    assert not list((tmp_path / "run" / "data").glob(".*"))  # no temporary file left behind


def test_disk_full_fails_clearly_records_nothing_and_resume_completes(
    ray_runtime, inp, clean_digest, tmp_path, monkeypatch
):
    marker = tmp_path / "fired"
    monkeypatch.setenv(faults.ENV, f"write_enospc:3:{marker}")
    spec = parse_job_spec(job(inp, tmp_path / "run"))
    with pytest.raises(
        OutputError, match=r"shard 3 could not be written: .*No space left on device"
    ):
        JobRunner(spec).run()
    manifest = Manifest.load(tmp_path / "run")  # what the failed run recorded
    recorded = [entry.shard_id for entry in manifest.shards if entry.complete]
    assert 3 not in recorded and not (tmp_path / "run" / "data").exists()
    monkeypatch.delenv(faults.ENV)  # space freed: resume
    summary = JobRunner(spec).run()
    assert summary.run_digest == clean_digest and summary.shards_resumed == len(recorded)
    exactly_once(tmp_path / "run", clean_digest)


def test_corrupted_complete_shard_is_regenerated_on_resume(
    ray_runtime, inp, clean_digest, tmp_path
):
    spec = parse_job_spec(job(inp, tmp_path / "run"))
    JobRunner(spec).run()
    victim = tmp_path / "run" / "data" / "part-000002.parquet"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the file
    victim.write_bytes(bytes(data))
    summary = JobRunner(spec).run()
    assert summary.shards_resumed == ROWS // SHARD - 1  # all but the corrupted one kept
    exactly_once(tmp_path / "run", clean_digest)


SERVE = [sys.executable, "-m", "rollout.cli.main", "serve"]


def test_service_killed_mid_job_and_restarted(inp, clean_digest, tmp_path):
    """SIGKILL the service while a job runs (shards recorded, others in flight), restart it:
    the job resumes from its run directory and ends with the undisturbed digest."""
    from rollout.client import RolloutClient, state_name

    root = inp.parent
    state = tmp_path / "state"
    spec = job(inp, root / "svc-run")
    spec["engine"]["options"]["tokens_per_s"] = 100  # slow enough to be killed mid-job

    def start() -> tuple[subprocess.Popen, str]:
        from tests.cli.test_serve import free_port

        address = f"127.0.0.1:{free_port()}"
        proc = subprocess.Popen(SERVE + ["--address", address, "--state-dir", str(state),
                                         "--data-root", str(root)])  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with RolloutClient(address, timeout=2) as probe:
                    if probe.health() == "SERVING":
                        return proc, address
            except Exception:  # not listening yet
                time.sleep(0.3)
        proc.kill()
        raise AssertionError("the service did not start")

    proc, address = start()
    try:
        with RolloutClient(address) as client:
            job_id = client.submit(spec).job_id
            for update in client.watch(job_id):
                if update.progress.shards_done >= 2:
                    break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        proc, address = start()
        with RolloutClient(address) as client:
            last = list(client.watch(job_id))[-1]
            assert state_name(last) == "SUCCEEDED", last.error
            assert last.run_digest == clean_digest
            assert client.health() == "SERVING"
        exactly_once(root / "svc-run", clean_digest)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def test_fault_points_are_documented():
    doc = faults.__doc__ or ""
    assert all(p in doc for p in faults.POINTS)
