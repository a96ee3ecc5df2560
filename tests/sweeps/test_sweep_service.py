"""Sweeps on the service (a real server on loopback, the synthetic engine): the sweep lives
in the service (a client that submits and goes away loses nothing), gives the digest the
same sweep gives when run here, re-attaches by request id, is checked like any job, and
can be cancelled."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import grpc
import pytest

from rollout.api.server import Server
from rollout.client import RolloutClient, state_name
from rollout.sweeps.remote import request_id_of
from rollout.sweeps.runner import SweepRunner
from rollout.sweeps.spec import parse_sweep


@pytest.fixture
def service(ray_runtime, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "q.jsonl").write_text("".join(json.dumps({"q": f"q{i}", "answer": f"w{i}"}) + "\n" for i in range(6)))  # fmt: skip
    server = Server("127.0.0.1:0", tmp_path / "state", [root])
    server.start()
    with RolloutClient(f"127.0.0.1:{server.port}", timeout=60) as client:
        yield root, client
        assert client.health() == "SERVING"
    server.stop()


def sweep(root, **over) -> dict:
    base = {"input": {"path": str(root / "q.jsonl")}, "prompt": {"column": "q"},
            "sampling": {"max_tokens": 6}, "engine": {"name": "synthetic", "options": over.pop("engine_options", {})},
            "carry_columns": ["answer"], "pool": {"cpus_per_actor": 0.5}, "shard_size": 2,
            "scoring": [{"name": "hit", "scorer": "regex_match", "pattern": r"(w\d)", "reference": "answer", "occurrence": "first"}]}  # fmt: skip
    return {"name": "svc", "base": base, "axes": {"sampling.temperature": [0.0, 1.0], "n": [1, 3]}} | over  # fmt: skip


def follow(client, sweep_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    for s in client.watch_sweep(sweep_id):
        if state_name(s) in ("SUCCEEDED", "FAILED", "CANCELLED") or time.monotonic() > deadline:
            return s
    return client.get_sweep(sweep_id)


def test_a_sweep_on_the_service_equals_the_same_sweep_run_here(service, tmp_path):
    root, client = service
    data = sweep(root)
    rid = request_id_of(data, str(root / "sw"))
    submitted = client.submit_sweep(data, str(root / "sw"), rid)
    assert len(submitted.cells) == 4 and submitted.rows_total == 6 * (1 + 3) * 2
    done = follow(client, submitted.sweep_id)
    assert state_name(done) == "SUCCEEDED", [c.error for c in done.cells]
    assert {json.loads(c.settings_json)["n"] for c in done.cells} == {1, 3}
    assert sum(c.progress.rows_cached for c in done.cells) == 6 * 2  # n = 3 reused sample 0
    for name in ("report.json", "report.md", "report.html"):
        assert (root / "sw" / name).stat().st_size > 0
    assert "temperature=0.0" in done.report_markdown
    here = SweepRunner(parse_sweep(data), data["base"], tmp_path / "here").run()
    assert done.digest == here.digest
    # the same submission again is the same sweep, already done: nothing is queued
    again = client.submit_sweep(data, str(root / "sw"), rid)
    assert again.sweep_id == submitted.sweep_id and state_name(again) == "SUCCEEDED"
    with pytest.raises(grpc.RpcError) as err:
        client.submit_sweep(sweep(root, name="other"), str(root / "sw"), rid)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert asdict(here)["state"] == "done"


def test_a_sweep_is_checked_like_its_jobs(service, tmp_path):
    root, client = service
    with pytest.raises(grpc.RpcError) as err:
        client.submit_sweep(sweep(root), str(tmp_path / "outside"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED and "outside the data roots" in err.value.details()  # fmt: skip
    bad = sweep(root)
    bad["axes"] = {"n": [0, 1]}
    with pytest.raises(grpc.RpcError) as err:
        client.submit_sweep(bad, str(root / "bad"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sweep cell n=0" in err.value.details()  # fmt: skip
    with pytest.raises(grpc.RpcError) as err:
        client.get_sweep("nope")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_cancelling_a_sweep_cancels_its_cells(service):
    root, client = service
    slow = sweep(root, engine_options={"tokens_per_s": 2})
    submitted = client.submit_sweep(slow, str(root / "slow"))
    client.cancel_sweep(submitted.sweep_id)
    done = follow(client, submitted.sweep_id)
    assert state_name(done) == "CANCELLED"
    assert {state_name(c) for c in done.cells} <= {"CANCELLED", "SUCCEEDED"}
    assert "CANCELLED" in {state_name(c) for c in done.cells}
