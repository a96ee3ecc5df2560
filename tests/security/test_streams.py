"""Open streams cannot starve the server: 40 watchers on one job, and unary calls and health
checks are still answered at once (32 watchers used to take every worker thread)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.api.server import Server
from rollout.api.servicer import pb, pb_grpc
from rollout.api.streams import StreamBudget, client_host
from rollout.client import RolloutClient


def test_client_host_of_grpc_peers():
    assert client_host("ipv4:127.0.0.1:51234") == "127.0.0.1"
    assert client_host("ipv6:[::1]:6000") == "::1"
    assert client_host("unix:/tmp/s") == "unix:/tmp/s"
    with pytest.raises(ValueError, match="per-client streams"):
        StreamBudget(total=4, per_client=5)


def slow_spec(root: Path) -> dict:
    return {
        "input": {"path": str(root / "in.parquet")},
        "prompt": {"column": "q"},
        "sampling": {"max_tokens": 16},
        "engine": {
            "name": "synthetic",
            "options": {"tokens_per_s": 20, "output_len": "fixed", "mean_output_len": 16},
        },  # fmt: skip
        "pool": {"actors": 1, "cpus_per_actor": 0.5},
        "shard_size": 1,
        "output": str(root / "slow-run"),
    }


def test_forty_watchers_do_not_starve_unary_calls_or_health(ray_runtime, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    pq.write_table(pa.table({"q": [f"question {i}" for i in range(40)]}), root / "in.parquet")
    server = Server("127.0.0.1:0", tmp_path / "state", [root], max_streams=32, max_streams_per_client=16)  # fmt: skip
    server.start()
    address = f"127.0.0.1:{server.port}"
    channels, calls = [], []
    try:
        with RolloutClient(address, timeout=3) as client:
            job_id = client.submit(slow_spec(root)).job_id
            opened, refused = 0, []
            for _ in range(40):
                channel = grpc.insecure_channel(address)
                channels.append(channel)
                call = pb_grpc.RolloutServiceStub(channel).WatchJob(
                    pb.WatchJobRequest(job_id=job_id)
                )
                calls.append(call)
                try:
                    next(call)  # the current state comes first
                    opened += 1
                except grpc.RpcError as exc:
                    refused.append(exc)
            # one client host may hold 16 streams; the rest are refused at once, saying why
            assert opened == 16 and len(refused) == 24
            assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused)
            assert "this client (127.0.0.1) has 16 of its 16 streams open" in refused[0].details()
            assert server.streams.open_streams() == 16
            # with the watchers open, everything else answers within its 3 s deadline
            started = time.monotonic()
            assert client.health() == "SERVING"
            assert client.get(job_id).job_id == job_id
            assert any(j.job_id == job_id for j in client.list())
            other = client.submit(slow_spec(root) | {"output": str(root / "second-run")})
            assert other.job_id != job_id
            assert time.monotonic() - started < 12
            client.cancel(job_id)
            client.cancel(other.job_id)
        for call in calls:
            call.cancel()
        deadline = time.monotonic() + 30
        while server.streams.open_streams() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.streams.open_streams() == 0  # closed streams give their slots back
    finally:
        for channel in channels:
            channel.close()
        server.stop()
