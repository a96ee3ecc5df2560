"""Data roots enforced where files are used: each escape an outside test found, replayed
against a real service on loopback (synthetic engine), refused with PERMISSION_DENIED
naming the path, nothing read or written outside, and the service still serving."""

from __future__ import annotations

import os
import time
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.api.server import Server
from rollout.client import RolloutClient, state_name

SECRET = "SECRET-OUTSIDE-1"


@pytest.fixture
def world(ray_runtime, tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    pq.write_table(pa.table({"q": ["good question"] * 4}), root / "good.parquet")
    pq.write_table(pa.table({"q": [SECRET] * 4}), outside / "secret.parquet")
    server = Server("127.0.0.1:0", tmp_path / "state", [root])
    server.start()
    with RolloutClient(f"127.0.0.1:{server.port}", timeout=30) as client:
        yield root, outside, client
        assert client.health() == "SERVING"
    server.stop()


def spec(root: Path, inp: str, out: str, **options) -> dict:
    return {"input": {"path": inp}, "prompt": {"column": "q"}, "sampling": {"max_tokens": 4},
            "engine": {"name": "synthetic", "options": options}, "shard_size": 2,
            "pool": {"actors": 1, "cpus_per_actor": 0.5}, "output": str(root / out)}  # fmt: skip


def refused(client: RolloutClient, job: dict, *needles: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.submit(job)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
    for needle in needles:
        assert needle in err.value.details()


def test_a_symlinked_file_in_an_input_folder(world):
    root, outside, client = world
    (root / "folder").mkdir()
    (root / "folder" / "a.parquet").symlink_to(root / "good.parquet")
    (root / "folder" / "b.parquet").symlink_to(outside / "secret.parquet")
    refused(client, spec(root, str(root / "folder"), "o1"), "b.parquet", "outside the data roots")


def test_a_glob_through_a_symlinked_folder(world):
    root, outside, client = world
    (root / "g").mkdir()
    (root / "g" / "evil").symlink_to(outside)
    refused(
        client, spec(root, str(root / "g" / "*" / "secret.parquet"), "o2"), "outside the data roots"
    )


def test_a_path_like_engine_option_outside(world):
    root, outside, client = world
    claim = outside / "claimed"
    refused(client, spec(root, str(root / "good.parquet"), "o3", slow_claim_file=str(claim)),
            "engine.options.slow_claim_file", "outside the data roots")  # fmt: skip
    assert not claim.exists()


def test_an_output_inside_another_runs_folder(world):
    root, _, client = world
    first = client.submit(spec(root, str(root / "good.parquet"), "run-a"))
    assert state_name(list(client.watch(first.job_id))[-1]) == "SUCCEEDED"
    refused(
        client,
        spec(root, str(root / "good.parquet"), "run-a/data/nested"),
        "lies inside the run at",
    )
    assert sorted(p.name for p in (root / "run-a" / "data").iterdir()) == ["part-000000.parquet", "part-000001.parquet"]  # fmt: skip


def _queued_behind_a_slow_job(root: Path, client: RolloutClient, job: dict) -> str:
    """Submit a slow job (the service runs one at a time), then `job`: it waits in the queue."""
    slow = spec(root, str(root / "good.parquet"), "slow", tokens_per_s=4, output_len="fixed", mean_output_len=4)  # fmt: skip
    client.submit(slow)
    queued = client.submit(job).job_id
    assert state_name(client.get(queued)) == "QUEUED"
    return queued


def _final(client: RolloutClient, job_id: str):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = client.get(job_id)
        if state_name(job) in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return job
        time.sleep(0.2)
    raise AssertionError("the job did not end")


def test_an_input_swapped_for_a_symlink_while_queued(world):
    root, outside, client = world
    pq.write_table(pa.table({"q": ["fine"] * 4}), root / "later.parquet")
    queued = _queued_behind_a_slow_job(root, client, spec(root, str(root / "later.parquet"), "o5"))
    (root / "later.parquet").unlink()
    (root / "later.parquet").symlink_to(outside / "secret.parquet")  # after submit, before it runs
    job = _final(client, queued)
    assert state_name(job) == "FAILED" and "outside the data roots" in job.error
    assert not (root / "o5" / "data").exists()


def test_an_output_parent_swapped_for_a_symlink_while_queued(world):
    root, outside, client = world
    (root / "parent").mkdir()
    queued = _queued_behind_a_slow_job(
        root, client, spec(root, str(root / "good.parquet"), "parent/run")
    )
    (root / "parent").rmdir()
    os.symlink(outside, root / "parent")  # the whole run would land outside
    job = _final(client, queued)
    assert state_name(job) == "FAILED" and "outside the data roots" in job.error
    assert not (outside / "run").exists()


def test_an_audit_of_a_run_whose_shard_is_a_symlink_outside(world):
    root, outside, client = world
    done = client.submit(spec(root, str(root / "good.parquet"), "audited"))
    assert state_name(list(client.watch(done.job_id))[-1]) == "SUCCEEDED"
    shard = root / "audited" / "data" / "part-000000.parquet"
    moved = outside / "part-000000.parquet"
    shard.rename(moved)
    shard.symlink_to(moved)  # the run's file now lives outside the roots
    with pytest.raises(grpc.RpcError) as err:
        client.audit(str(root / "audited"), done.job_id)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (
        "part-000000.parquet" in err.value.details()
        and "outside the data roots" in err.value.details()
    )


def test_an_empty_store_beside_run_folders_is_reported(world, tmp_path):
    from rollout.service.manager import JobManager
    from rollout.service.store import JobStore

    root, _, client = world
    done = client.submit(spec(root, str(root / "good.parquet"), "kept"))
    assert state_name(list(client.watch(done.job_id))[-1]) == "SUCCEEDED"
    fresh = JobManager(JobStore(tmp_path / "new-state" / "jobs.sqlite"), [root])
    assert fresh.orphaned_runs() == [root / "kept"]
