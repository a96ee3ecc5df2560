"""The gRPC service on loopback: real server, real SQLite store, real Ray jobs, the Python client."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.api.server import Server
from rollout.client import RolloutClient, state_name

QUESTIONS = [
    "Name a color.",
    "What is 2 + 2?",
    "Say hi.",
    "Name a fruit.",
    "What is ice?",
    "Name a bird.",
]


@pytest.fixture
def roots(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"qid": f"q{i}", "question": q} for i, q in enumerate(QUESTIONS)]
    pq.write_table(pa.Table.from_pylist(rows), data / "in.parquet")
    return data


def job_spec(root: Path, out: str, **extra) -> dict:
    spec = {
        "input": {"path": str(root / "in.parquet")},
        "prompt": {"column": "question", "chat": True},
        "id_column": "qid",
        "sampling": {"temperature": 0.7, "max_tokens": 4},
        "engine": {"name": "smollm2", "options": {"max_num_seqs": 8}},
        "shard_size": 2,
        "output": str(root / out),
    }
    spec.update(extra)
    return spec


def serve(tmp_path: Path, root: Path, **kw) -> tuple[Server, str]:
    server = Server("127.0.0.1:0", tmp_path / "state", [root], **kw)
    server.start()
    return server, f"127.0.0.1:{server.port}"


def wait_final(client: RolloutClient, job_id: str) -> list:
    return list(client.watch(job_id))


def test_submit_watch_list_manifest(ray_runtime, tmp_path, roots):
    server, address = serve(tmp_path, roots)
    try:
        with RolloutClient(address) as client:
            assert client.health() == "SERVING"
            job = client.submit(job_spec(roots, "run1"), request_id="req-1")
            assert state_name(job) == "QUEUED" and job.output == str(roots / "run1")
            assert client.submit(job_spec(roots, "run1"), request_id="req-1").job_id == job.job_id
            events = wait_final(client, job.job_id)
            states = [state_name(e) for e in events]
            assert states[-1] == "SUCCEEDED" and "RUNNING" in states
            assert events[-1].progress.shards_done == events[-1].progress.shards_total == 3
            assert events[-1].progress.rows == 6
            manifest = client.manifest(job.job_id)
            assert (
                manifest["run_digest"] == events[-1].run_digest and manifest["status"] == "complete"
            )
            assert manifest["config_hash"] == events[-1].config_hash
            late = list(
                client.watch(job.job_id)
            )  # a late watcher gets the current state, then the end
            assert [state_name(e) for e in late] == ["SUCCEEDED"]
            listed = list(client.list(["SUCCEEDED"]))
            assert [j.job_id for j in listed] == [job.job_id]
            assert list(client.list(["FAILED"])) == []
    finally:
        server.stop()


def test_bad_specs_and_paths_are_refused_with_their_status(ray_runtime, tmp_path, roots):
    outside = tmp_path / "outside"
    outside.mkdir()
    (roots / "escape").symlink_to(outside)
    server, address = serve(tmp_path, roots)
    try:
        with RolloutClient(address) as client:
            cases = [
                (job_spec(roots, "x", sampling={"top_p": 1.5}), grpc.StatusCode.INVALID_ARGUMENT,
                 "invalid sampling.top_p: top_p must be in (0, 1], got 1.5"),
                (job_spec(roots, "x", bogus=1), grpc.StatusCode.INVALID_ARGUMENT, "invalid bogus"),
                (job_spec(roots, str(outside / "o")), grpc.StatusCode.PERMISSION_DENIED, "outside the data roots"),
                (job_spec(roots, "../outside/o"), grpc.StatusCode.PERMISSION_DENIED, "outside the data roots"),
                (job_spec(roots, "escape/o"), grpc.StatusCode.PERMISSION_DENIED, "outside the data roots"),
                ({**job_spec(roots, "x"), "input": {"path": "s3://bucket/x"}}, grpc.StatusCode.PERMISSION_DENIED,
                 "URIs are not served"),
                ({**job_spec(roots, "x"), "input": {"path": str(roots / "none.parquet")}},
                 grpc.StatusCode.INVALID_ARGUMENT, "no such file or directory"),
                (job_spec(roots, "x", prompt={"column": "nope"}), grpc.StatusCode.INVALID_ARGUMENT,
                 "has no column 'nope' (prompt.column); available columns: qid, question"),
                (job_spec(roots, "x", engine={"name": "vllm"}), grpc.StatusCode.INVALID_ARGUMENT,
                 "unknown engine 'vllm'"),
            ]  # fmt: skip
            for spec, code, message in cases:
                with pytest.raises(grpc.RpcError) as err:
                    client.submit(spec)
                assert err.value.code() == code and message in err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                client.get("nope")
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert list(client.list()) == []  # nothing was accepted
            assert client.health() == "SERVING"
    finally:
        server.stop()


def test_failed_job_has_a_reason_and_cancel_keeps_complete_shards(ray_runtime, tmp_path, roots):
    server, address = serve(tmp_path, roots)
    try:
        with RolloutClient(address) as client:
            pq.write_table(
                pa.Table.from_pylist([{"qid": "a", "question": None}]), roots / "null.parquet"
            )
            bad = client.submit(
                {**job_spec(roots, "bad"), "input": {"path": str(roots / "null.parquet")}}
            )
            long = client.submit(job_spec(roots, "long", n=4, sampling={"max_tokens": 24, "ignore_eos": True},
                                          shard_size=1))  # fmt: skip
            queued = client.submit(job_spec(roots, "later"))
            assert state_name(client.cancel(queued.job_id)) == "CANCELLED"  # jobs run one at a time
            end = wait_final(client, bad.job_id)[-1]
            assert state_name(end) == "FAILED"
            assert "input row 0 (example 'a'): column 'question' is null" in end.error
            for update in client.watch(long.job_id):
                if update.progress.shards_done >= 1:
                    client.cancel(long.job_id)
            final = client.get(long.job_id)
            assert state_name(final) == "CANCELLED"
            manifest = json.loads((roots / "long" / "manifest.json").read_text())
            assert (
                manifest["status"] == "running"
                and 1 <= sum(s["complete"] for s in manifest["shards"]) < 6
            )
            assert not (roots / "long" / "data").exists()
            assert not (roots / "later").exists()
    finally:
        server.stop()


def test_restart_resumes_running_jobs_to_the_same_digest(ray_runtime, tmp_path, roots):
    server, address = serve(tmp_path, roots)
    with RolloutClient(address) as client:
        job = client.submit(
            job_spec(roots, "r", sampling={"max_tokens": 12, "ignore_eos": True}, shard_size=1)
        )
        for update in client.watch(job.job_id):
            if update.progress.shards_done >= 2:
                break
    server.stop()
    again, address = serve(tmp_path, roots)
    try:
        with RolloutClient(address) as client:
            end = wait_final(client, job.job_id)[-1]
            assert state_name(end) == "SUCCEEDED"
            reference = client.submit(
                job_spec(roots, "ref", sampling={"max_tokens": 12, "ignore_eos": True})
            )
            ref_end = wait_final(client, reference.job_id)[-1]
            assert end.run_digest == ref_end.run_digest and end.config_hash == ref_end.config_hash
    finally:
        again.stop()


def test_token_auth_and_tls(ray_runtime, tmp_path, roots):
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    cert, key = (tmp_path / "cert.pem").read_bytes(), (tmp_path / "key.pem").read_bytes()
    server, address = serve(tmp_path, roots, token="s3cret", tls=(cert, key))
    address = address.replace("127.0.0.1", "localhost")
    try:
        with RolloutClient(address, root_cert=cert) as anonymous:
            assert anonymous.health() == "SERVING"  # probes need no token
            with pytest.raises(grpc.RpcError) as err:
                list(anonymous.list())
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with (
            RolloutClient(address, token="wrong", root_cert=cert) as wrong,
            pytest.raises(grpc.RpcError) as err,
        ):
            wrong.get("x")
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with RolloutClient(address, token="s3cret", root_cert=cert) as client:
            assert list(client.list()) == []
        with RolloutClient(address, token="s3cret") as plaintext, pytest.raises(grpc.RpcError):
            plaintext.get("x")  # a plaintext client cannot talk to a TLS server
    finally:
        server.stop()


def test_reflection_lists_the_service(ray_runtime, tmp_path, roots):
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    server, address = serve(tmp_path, roots)
    try:
        with grpc.insecure_channel(address) as channel:
            services = ProtoReflectionDescriptorDatabase(channel).get_services()
        assert "rollout.v1.RolloutService" in services and "grpc.health.v1.Health" in services
    finally:
        server.stop()


def test_list_pages_through_jobs_in_submission_order(ray_runtime, tmp_path, roots):
    server, address = serve(tmp_path, roots)
    try:
        with RolloutClient(address) as client:
            first = client.submit(
                job_spec(roots, "p0", sampling={"max_tokens": 24, "ignore_eos": True}, shard_size=1)
            )
            later = [client.submit(job_spec(roots, f"p{i}")).job_id for i in range(1, 4)]
            for job_id in later:  # still queued behind the first: one job runs at a time
                assert state_name(client.cancel(job_id)) == "CANCELLED"
            assert [j.job_id for j in client.list(["CANCELLED"], page_size=1)] == later
            assert [j.job_id for j in client.list(page_size=2)] == [first.job_id, *later]
            client.cancel(first.job_id)
            assert state_name(wait_final(client, first.job_id)[-1]) == "CANCELLED"
    finally:
        server.stop()
