"""One spec cannot stall the service: actors no node can hold are refused at submit with the
numbers, actor counts are capped at the shards, engine start has a deadline, and a cancel takes
effect while actors start and survives a restart."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.api.server import Server
from rollout.client import RolloutClient, state_name
from rollout.errors import EngineError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime import cluster
from rollout.runtime.runner import JobRunner
from rollout.service.store import JobStore


@pytest.fixture
def root(tmp_path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    pq.write_table(pa.table({"q": [f"q{i}" for i in range(4)]}), root / "in.parquet")
    return root


def spec(root: Path, out: str, pool: dict | None = None, **options) -> dict:
    return {"input": {"path": str(root / "in.parquet")}, "prompt": {"column": "q"},
            "sampling": {"max_tokens": 4}, "engine": {"name": "synthetic", "options": options},
            "shard_size": 2, "pool": {"cpus_per_actor": 0.5, **(pool or {})}, "output": str(root / out)}  # fmt: skip


def test_pool_sizes_are_capped_and_impossible_actors_named(ray_runtime):
    assert cluster.pool_size(100_000, 0.5, 0, 3) == 3  # no more actors than shards
    cpus = int(sum(n["Resources"].get("CPU", 0) for n in ray_runtime.nodes() if n["Alive"]))
    assert cluster.pool_size(100_000, 1, 0, 10**6) == cpus  # no more than the cluster holds
    with pytest.raises(Exception, match=r"asks for 1 CPUs and 1 GPUs, and no node of the Ray cluster has that \(its nodes: \d+ CPU/0 GPU"):  # fmt: skip
        cluster.pool_size(1, 1, 1, 1)


def test_the_service_refuses_what_no_node_holds_and_runs_100000_actors_as_two(
    ray_runtime, root, tmp_path
):
    server = Server("127.0.0.1:0", tmp_path / "state", [root])
    server.start()
    try:
        with RolloutClient(f"127.0.0.1:{server.port}", timeout=30) as client:
            for pool, needle in (
                ({"gpus_per_actor": 1}, "1 GPUs"),
                ({"cpus_per_actor": 64}, "64 CPUs"),
            ):
                with pytest.raises(grpc.RpcError) as err:
                    client.submit(spec(root, "never", pool))
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (
                    needle in err.value.details()
                    and "no node of the Ray cluster" in err.value.details()
                )
            many = client.submit(spec(root, "many", {"actors": 100_000}))
            last = list(client.watch(many.job_id))[-1]
            assert state_name(last) == "SUCCEEDED", last.error
            assert client.health() == "SERVING"
    finally:
        server.stop()


def test_a_cancel_takes_effect_while_actors_start(ray_runtime, root, tmp_path):
    server = Server("127.0.0.1:0", tmp_path / "state", [root])
    server.start()
    try:
        with RolloutClient(f"127.0.0.1:{server.port}", timeout=30) as client:
            job = client.submit(spec(root, "slow-start", startup_s=60))
            while state_name(client.get(job.job_id)) != "RUNNING":
                time.sleep(0.1)
            time.sleep(1.0)  # the actor is starting (a 60 s engine load)
            started = time.monotonic()
            client.cancel(job.job_id)
            last = list(client.watch(job.job_id))[-1]
            assert state_name(last) == "CANCELLED" and time.monotonic() - started < 20
    finally:
        server.stop()


def test_engine_start_has_a_deadline(ray_runtime, root):
    job = parse_job_spec(spec(root, "deadline", {"start_timeout_s": 2}, startup_s=60))
    started = time.monotonic()
    with pytest.raises(EngineError, match=r"1 of 1 engine actors did not start within 2 s \(pool.start_timeout_s\)"):  # fmt: skip
        JobRunner(job).run()
    assert time.monotonic() - started < 30


def test_a_cancel_survives_a_restart(tmp_path):
    store = JobStore(tmp_path / "jobs.sqlite")
    cancelled, _ = store.submit({"x": 1}, str(tmp_path / "a"), None)
    running, _ = store.submit({"x": 2}, str(tmp_path / "b"), None)
    for record in (cancelled, running):
        store.update(record.job_id, state="RUNNING")
    store.update(cancelled.job_id, cancel_requested=1)  # then the service was stopped
    store.close()
    store = JobStore(tmp_path / "jobs.sqlite")  # the next start
    assert store.requeue_interrupted() == [running.job_id]
    assert store.get(cancelled.job_id).state == "CANCELLED"
    assert store.get(running.job_id).state == "QUEUED"
