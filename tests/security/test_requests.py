"""Malformed and oversized requests get INVALID_ARGUMENT naming the field (never INTERNAL or
UNKNOWN), values are carried exactly and echoed shortened, and the service keeps serving."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.protobuf import struct_pb2

from rollout.api.server import Server
from rollout.api.servicer import pb, pb_grpc
from rollout.client import RolloutClient

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def service(ray_runtime, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    pq.write_table(pa.table({"q": ["a", "b"]}), root / "in.parquet")
    server = Server("127.0.0.1:0", tmp_path / "state", [root])
    server.start()
    address = f"127.0.0.1:{server.port}"
    channel = grpc.insecure_channel(address)
    with RolloutClient(address, timeout=30) as client:
        yield root, client, pb_grpc.RolloutServiceStub(channel)
        assert client.health() == "SERVING"
    channel.close()
    server.stop()


def spec(root: Path, **over) -> dict:
    return {"input": {"path": str(root / "in.parquet")}, "prompt": {"column": "q"},
            "sampling": {"max_tokens": 2}, "engine": {"name": "synthetic"},
            "pool": {"cpus_per_actor": 0.5}, "output": str(root / "out")} | over  # fmt: skip


def status(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def submit_raw(stub, data: dict, request_id: str = ""):
    struct = struct_pb2.Struct()
    struct.update(data)
    return stub.SubmitJob(pb.SubmitJobRequest(spec=struct, request_id=request_id), timeout=30)


def test_malformed_values_are_invalid_arguments(service):
    root, client, stub = service
    code, msg = status(lambda: client.submit(spec(root, output=str(root / "o\0ut"))))
    assert code == INVALID and "output" in msg and "NUL byte" in msg
    code, msg = status(lambda: submit_raw(stub, spec(root, sampling={"temperature": float("nan")})))
    assert code == INVALID and "number JSON cannot carry" in msg
    code, msg = status(lambda: submit_raw(stub, spec(root, sampling={"max_tokens": float("inf")})))
    assert code == INVALID
    code, msg = status(lambda: stub.ListJobs(pb.ListJobsRequest(states=[99]), timeout=30))
    assert code == INVALID and "states must be among" in msg
    code, msg = status(lambda: stub.ListJobs(pb.ListJobsRequest(page_token="9" * 30), timeout=30))
    assert code == INVALID and "page_token" in msg


def test_job_seed_is_carried_exactly(service):
    root, client, stub = service
    top = 2**64 - 1
    job = client.submit(spec(root, job_seed=top, output=str(root / "seeded")))
    assert job.spec["job_seed"] == str(top)  # echoed exactly, as a string
    code, msg = status(lambda: submit_raw(stub, spec(root, job_seed=float(2**53 + 2))))
    assert code == INVALID and "job_seed" in msg and "decimal string" in msg


def test_oversized_values_are_refused_and_echoed_short(service):
    root, client, stub = service
    code, msg = status(lambda: client.submit(spec(root), request_id="r" * 900_000))
    assert code == INVALID and "request_id is 900000 characters" in msg and len(msg) < 300
    code, msg = status(lambda: client.submit(spec(root, output="/" + "p" * 900_000)))
    assert code == INVALID and "at most 4096" in msg and len(msg) < 300
    assert len(list(client.list())) == 0  # nothing was stored


def test_a_request_id_reused_with_another_spec(service):
    root, client, _ = service
    first = client.submit(spec(root), request_id="once")
    assert client.submit(spec(root), request_id="once").job_id == first.job_id  # idempotent
    code, msg = status(lambda: client.submit(spec(root, n=2), request_id="once"))
    assert code == grpc.StatusCode.ALREADY_EXISTS and first.job_id in msg


def test_a_damaged_job_store_is_named_at_start(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "jobs.sqlite").write_bytes(b"this is not a database" * 100)
    out = subprocess.run([sys.executable, "-m", "rollout.cli.main", "serve", "--state-dir", str(state),
                          "--data-root", str(tmp_path), "--address", "127.0.0.1:0"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "the job store" in out.stderr and "cannot be read" in out.stderr
    assert "Traceback" not in out.stderr


def _field(num: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, encoded by hand (no protobuf library would build
    what an attacker can send)."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    return varint(num << 3 | 2) + varint(len(payload)) + payload


def test_a_spec_nested_5000_levels_deep(service):
    _, client, _ = service
    value = _field(3, b"x")  # Value.string_value
    for _ in range(5000):  # Value.struct_value -> Struct.fields -> map entry {key, value}
        value = _field(5, _field(1, _field(1, b"a") + _field(2, value)))
    request = _field(1, _field(1, _field(1, b"input") + _field(2, value)))  # SubmitJobRequest.spec
    channel = grpc.insecure_channel(client.address)
    call = channel.unary_unary("/rollout.v1.RolloutService/SubmitJob", request_serializer=None,
                               response_deserializer=None)  # fmt: skip
    code, msg = status(lambda: call(request, timeout=30))
    assert code == INVALID and "nested deeper than protobuf allows" in msg
    channel.close()


def test_list_pages_stay_under_the_message_limit_with_large_specs(service):
    """Six jobs with specs of about 900 KB used to make ListJobs fail for everyone (a 5 MiB
    response over the 4 MiB default). Pages are now bounded in bytes: every job is listed,
    over several pages."""
    root, client, _ = service
    big = "Answer {q} " + "x" * 900_000
    ids = [client.submit(spec(root, prompt={"template": big}, output=str(root / f"big{i}"))).job_id
           for i in range(6)]  # fmt: skip
    try:
        listed = [job.job_id for job in client.list(page_size=50)]  # the client pages through
        assert listed == ids
        first = client._stub.ListJobs(pb.ListJobsRequest(page_size=50), timeout=30)
        assert 1 <= len(first.jobs) < 6 and first.next_page_token
        assert first.ByteSize() < 4 * 1024 * 1024
    finally:
        for job_id in ids:
            client.cancel(job_id)
