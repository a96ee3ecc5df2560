"""Scoring through the service: built-in scorers run; a user scorer runs only when the
operator allowed its module (--allow-scorer), else PERMISSION_DENIED before anything of it
is imported; bad scorer options are INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import json
import sys
import time

import grpc
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.api.server import Server
from rollout.client import RolloutClient, state_name

USER = "tests.service.planted_scorer:planted"


@pytest.fixture
def service(ray_runtime, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    pq.write_table(pa.table({"q": ["x", "y", "z"], "answer": ["w1", "w2", "w3"]}), root / "in.parquet")  # fmt: skip
    server = Server("127.0.0.1:0", tmp_path / "state", [root], allowed_scorers=("tests.service.allowed",))  # fmt: skip
    server.start()
    with RolloutClient(f"127.0.0.1:{server.port}", timeout=30) as client:
        yield root, client
        assert client.health() == "SERVING"
    server.stop()


def spec(root, out: str, scoring: list) -> dict:
    return {"input": {"path": str(root / "in.parquet")}, "prompt": {"column": "q"}, "n": 2,
            "sampling": {"max_tokens": 4}, "engine": {"name": "synthetic"}, "output": str(root / out),
            "pool": {"cpus_per_actor": 0.5}, "carry_columns": ["answer"], "scoring": scoring}  # fmt: skip


def test_a_user_scorer_the_operator_did_not_allow_is_refused_unimported(service):
    root, client = service
    sys.modules.pop("tests.service.planted_scorer", None)
    with pytest.raises(grpc.RpcError) as err:
        client.submit(spec(root, "o1", [{"name": "p", "scorer": USER}]))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "scoring.p.scorer" in err.value.details() and "--allow-scorer: tests.service.allowed" in err.value.details()  # fmt: skip
    assert "tests.service.planted_scorer" not in sys.modules  # nothing of it ran
    with pytest.raises(grpc.RpcError) as err:
        client.submit(spec(root, "o2", [{"name": "m", "scorer": "exact_match"}]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "scoring.m.reference: Field required" in err.value.details()


def test_a_scored_job_through_the_service(service):
    root, client = service
    job = client.submit(spec(root, "o3", [
        {"name": "hit", "scorer": "regex_match", "pattern": r"(w\d)", "reference": "answer",
         "occurrence": "first", "advantages": True, "pass_at_k": [1, 2]},
        {"name": "tidy", "scorer": "tests.service.allowed.scorers:tidy", "columns": ["answer"]},
    ]))  # fmt: skip
    deadline = time.monotonic() + 120
    while state_name(job) not in ("SUCCEEDED", "FAILED") and time.monotonic() < deadline:
        time.sleep(0.2)
        job = client.get(job.job_id)
    assert state_name(job) == "SUCCEEDED", job.error
    scores = json.loads((root / "o3" / "scores.json").read_text())
    assert set(scores["metrics"]) == {"hit", "tidy"} and scores["metrics"]["tidy"]["mean"] == 1.0
    assert set(scores["metrics"]["hit"]["pass_at_k"]) == {"1", "2"}
