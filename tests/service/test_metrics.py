"""`rollout serve --metrics-address`: a real scrape over HTTP while a job runs, parsed with
prometheus_client's own parser: jobs by state, queue depth, rows, tokens, shard latencies,
cache hits, and the counters once the job ends."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rollout.api.server import Server
from rollout.client import RolloutClient, state_name


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


@pytest.fixture
def service(ray_runtime, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "q.jsonl").write_text("".join(json.dumps({"q": f"question {i}"}) + "\n" for i in range(8)))  # fmt: skip
    server = Server("127.0.0.1:0", tmp_path / "state", [root], metrics_address="127.0.0.1:0")
    server.start()
    with RolloutClient(f"127.0.0.1:{server.port}", timeout=30) as client:
        yield root, client, server.metrics_port
    server.stop()


def job(root, out: str, **engine) -> dict:
    return {"input": {"path": str(root / "q.jsonl")}, "prompt": {"column": "q"}, "n": 2,
            "sampling": {"max_tokens": 8}, "engine": {"name": "synthetic", "options": engine},
            "shard_size": 2, "pool": {"cpus_per_actor": 0.5}, "output": str(root / out),
            "cache": str(root / "cache")}  # fmt: skip


def wait(client, job_id: str):
    deadline = time.monotonic() + 120
    record = client.get(job_id)
    while (
        state_name(record) not in ("SUCCEEDED", "FAILED", "CANCELLED")
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
        record = client.get(job_id)
    return record


def test_a_scrape_during_and_after_jobs(service):
    root, client, port = service
    before = scrape(port)
    assert before[("rollout_jobs", (("state", "RUNNING"),))] == 0
    slow = client.submit(job(root, "slow", tokens_per_s=40))
    queued = client.submit(job(root, "again"))
    deadline = time.monotonic() + 60
    during = scrape(port)
    while during[("rollout_jobs", (("state", "RUNNING"),))] < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        during = scrape(port)
    assert during[("rollout_jobs", (("state", "RUNNING"),))] == 1
    assert during[("rollout_queue_depth", ())] == 1
    assert state_name(wait(client, slow.job_id)) == "SUCCEEDED"
    assert state_name(wait(client, queued.job_id)) == "SUCCEEDED"
    after = scrape(port)
    assert after[("rollout_jobs", (("state", "SUCCEEDED"),))] == 2
    assert after[("rollout_rows_total", ())] == 32
    assert after[("rollout_cache_hits_total", ())] == 16  # the second job: all from the cache
    assert after[("rollout_rows_generated_total", ())] == 16
    assert after[("rollout_shards_total", ())] == 8
    assert after[("rollout_shard_seconds_count", ())] == 8
    assert after[("rollout_shard_seconds_bucket", (("le", "+Inf"),))] == 8
    assert after[("rollout_output_tokens_total", ())] > 0
    assert after[("rollout_jobs_finished_total", (("state", "SUCCEEDED"),))] == 2
    assert after[("rollout_actor_restarts_total", ())] == 0
    assert client.health() == "SERVING"


def test_the_grafana_dashboard_charts_only_metrics_the_service_serves(service):
    import re
    from pathlib import Path

    _, _, port = service
    served = {name for name, _ in scrape(port)}
    dashboard = json.loads(
        (Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"rollout_[a-z_]+", e)}
    assert used and used <= served, used - served
