"""Prometheus metrics of `rollout serve --metrics-address HOST:PORT` (prometheus_client).

Jobs by state and the queue depth are read from the job store at each scrape; rows,
tokens, shard latencies, cache hits and skipped rows are counted as shards finish; actor
restarts, shard retries and backup copies when a job ends. docs/grafana-dashboard.json
charts them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rollout.service.store import FINAL, STATES

SHARD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class _StoreCollector(Collector):
    """Gauges read from the job store when scraped."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts = self.store.count_by_state()
        jobs = GaugeMetricFamily("rollout_jobs", "Jobs in the store, by state.", labels=["state"])
        for state in STATES:
            jobs.add_metric([state], counts.get(state, 0))
        yield jobs
        yield GaugeMetricFamily("rollout_queue_depth", "Jobs waiting to run (QUEUED).", value=counts.get("QUEUED", 0))  # fmt: skip
        rate = sum(float(j.progress.get("output_tokens_per_s", 0.0)) for j in self.store.list(["RUNNING"], 0, 1000))  # fmt: skip
        yield GaugeMetricFamily("rollout_output_tokens_per_second", "Output tokens per second of the running jobs, together.", value=rate)  # fmt: skip


class Metrics:
    def __init__(self, store: Any) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rows = Counter("rollout_rows", "Output rows written.", registry=r)
        self.rows_generated = Counter("rollout_rows_generated", "Output rows the engines generated.", registry=r)  # fmt: skip
        self.cache_hits = Counter("rollout_cache_hits", "Output rows taken from a generation cache.", registry=r)  # fmt: skip
        self.rows_skipped = Counter("rollout_rows_skipped", "Rows left out by on_error: skip (or prompt.on_empty: skip).", registry=r)  # fmt: skip
        self.prompt_tokens = Counter("rollout_prompt_tokens", "Prompt tokens of the rows written.", registry=r)  # fmt: skip
        self.output_tokens = Counter("rollout_output_tokens", "Output tokens of the rows written.", registry=r)  # fmt: skip
        self.shards = Counter("rollout_shards", "Shards written.", registry=r)
        self.shard_seconds = Histogram("rollout_shard_seconds", "Time an engine actor spent on one shard.", buckets=SHARD_BUCKETS, registry=r)  # fmt: skip
        self.restarts = Counter("rollout_actor_restarts", "Engine actors replaced after they died.", registry=r)  # fmt: skip
        self.retries = Counter("rollout_shard_retries", "Shards run again after their actor died.", registry=r)  # fmt: skip
        self.backups = Counter("rollout_backup_copies", "Backup copies started for straggling shards.", registry=r)  # fmt: skip
        self.jobs_finished = Counter("rollout_jobs_finished", "Jobs that ended, by state.", ["state"], registry=r)  # fmt: skip
        for state in FINAL:  # every series exists from the first scrape
            self.jobs_finished.labels(state)
        r.register(_StoreCollector(store))
        self.server: Any = None

    def shard_done(self, result: Any) -> None:
        self.rows.inc(result.rows)
        self.rows_generated.inc(result.rows - result.rows_cached)
        self.cache_hits.inc(result.rows_cached)
        self.rows_skipped.inc(len(result.skipped))
        self.prompt_tokens.inc(result.prompt_tokens)
        self.output_tokens.inc(result.output_tokens)
        self.shards.inc()
        self.shard_seconds.observe(result.seconds)

    def job_finished(self, state: str, summary: Any = None) -> None:
        self.jobs_finished.labels(state).inc()
        if summary is not None:
            self.restarts.inc(summary.actor_restarts)
            self.retries.inc(summary.shard_retries)
            self.backups.inc(summary.backup_copies)

    def serve(self, address: str) -> int:
        """Serve /metrics at HOST:PORT (port 0: any free one); the port."""
        host, _, port = address.rpartition(":")
        self.server, _ = start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1", registry=self.registry)  # fmt: skip
        return self.server.server_port

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
