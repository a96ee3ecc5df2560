"""`rollout repeat`: run one job K times on K topologies and count distinct outputs.

Run 0 is the config as written; run i varies each named dimension by a fixed schedule:
  actors      1 + (actors - 1 + i) mod (the CPUs or GPUs the cluster has for actors)
  shard_size  shard_size x 1, 1/2, 2, 1/3, 3, 1/4, ... (at least 1)
  batch_size  engine.options.max_num_seqs / 2**i (at least 1)
None of them is part of config_hash, so a deterministic engine gives one run digest and
one distinct output per row, whatever K is.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollout.audit.report import DIVERGED, IDENTICAL
from rollout.audit.runs import RunDir
from rollout.errors import ConfigError
from rollout.jobs.spec import JobSpec
from rollout.runtime.runner import Progress

DIMENSIONS = ("actors", "shard_size", "batch_size")
BATCH_OPTION = "max_num_seqs"
DEFAULT_BATCH = 32


def parse_vary(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in names if x not in DIMENSIONS]
    if bad or not names:
        raise ConfigError("vary", text, f"must name some of {', '.join(DIMENSIONS)}")
    return names


def _factor(i: int) -> float:
    k = (i + 1) // 2 + 1
    return 1.0 if i == 0 else (1 / k if i % 2 else float(k))


def topology(spec: JobSpec, i: int, vary: tuple[str, ...], max_actors: int) -> JobSpec:
    """The job spec of run i: the same config, another topology."""
    pool, options = spec.pool, dict(spec.engine.options)
    shard_size = spec.shard_size
    if "actors" in vary:
        pool = pool.model_copy(update={"actors": 1 + (pool.actors - 1 + i) % max(1, max_actors)})
    if "shard_size" in vary:
        shard_size = max(1, math.floor(spec.shard_size * _factor(i)))
    if "batch_size" in vary:
        options[BATCH_OPTION] = max(1, int(options.get(BATCH_OPTION, DEFAULT_BATCH)) >> i)
    engine = spec.engine.model_copy(update={"options": options})
    return spec.model_copy(update={"pool": pool, "shard_size": shard_size, "engine": engine})


@dataclass
class RepeatRun:
    index: int
    actors: int
    shard_size: int
    batch_size: int | None
    output: str
    config_hash: str
    run_digest: str
    seconds: float


@dataclass
class RepeatReport:
    runs: list[RepeatRun]
    vary: list[str]
    distinct_run_digests: int = 0
    distinct_config_hashes: int = 0
    rows: int = 0  # distinct (row_index, sample_index)
    rows_with_one_output: int = 0
    max_outputs_per_row: int = 0
    rows_missing_somewhere: int = 0
    outputs_per_row: dict[int, int] = field(default_factory=dict)  # distinct outputs -> rows
    verdict: str = IDENTICAL

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == IDENTICAL else 1

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": self.exit_code}


def max_actors_available(spec: JobSpec) -> int:
    import ray

    resources = ray.cluster_resources()
    if spec.pool.gpus_per_actor > 0:
        return max(1, int(resources.get("GPU", 0) // spec.pool.gpus_per_actor))
    return max(1, int(resources.get("CPU", 1) // spec.pool.cpus_per_actor))


def repeat_job(
    spec: JobSpec,
    times: int,
    vary: tuple[str, ...],
    out_root: Path,
    ray_address: str | None = None,
    progress: Progress | None = None,
    announce: Any = None,
) -> RepeatReport:
    """Run `spec` `times` times into out_root/run-<i>, then count distinct outputs per row."""
    from rollout.runtime import cluster
    from rollout.runtime.runner import JobRunner

    if times < 2:
        raise ConfigError("times", times, "must be >= 2 to compare anything")
    out_root = out_root.expanduser().resolve()
    if out_root.exists() and any(out_root.iterdir()):
        raise ConfigError("out", str(out_root), "exists and is not empty; repeat needs fresh runs")
    cluster.connect(ray_address)
    limit = max_actors_available(spec)
    runs = []
    for i in range(times):
        job = topology(spec, i, vary, limit)
        job = job.model_copy(update={"output": str(out_root / f"run-{i}")})
        batch = job.engine.options.get(BATCH_OPTION)
        if announce:
            announce(f"run {i + 1}/{times}: actors={job.pool.actors} shard_size={job.shard_size} "
                     f"batch_size={batch if batch is not None else 'default'}")  # fmt: skip
        summary = JobRunner(job, ray_address, progress=progress).run()
        runs.append(RepeatRun(i, job.pool.actors, job.shard_size, batch, job.output,
                              summary.config_hash, summary.run_digest, summary.seconds))  # fmt: skip
    report = RepeatReport(runs, list(vary))
    report.distinct_run_digests = len({r.run_digest for r in runs})
    report.distinct_config_hashes = len({r.config_hash for r in runs})
    count_outputs(report, [RunDir(r.output) for r in runs])
    same = report.distinct_run_digests == 1 and report.max_outputs_per_row == 1
    report.verdict = IDENTICAL if same and not report.rows_missing_somewhere else DIVERGED
    return report


def count_outputs(report: RepeatReport, runs: list[RunDir]) -> None:
    """Distinct outputs per (row_index, sample_index) across runs: a k-way merge in row order."""

    def stream(k: int) -> Iterator[tuple[tuple[int, int], int, str]]:
        for key, rows, i in runs[k].rows():
            yield key, k, rows.row_hash[i]

    histogram: Counter[int] = Counter()
    current, hashes, present = None, set(), 0
    for key, _, rh in heapq.merge(*(stream(k) for k in range(len(runs)))):
        if key != current:
            if current is not None:
                histogram[len(hashes)] += 1
                report.rows_missing_somewhere += present < len(runs)
            current, hashes, present = key, set(), 0
        hashes.add(rh)
        present += 1
    if current is not None:
        histogram[len(hashes)] += 1
        report.rows_missing_somewhere += present < len(runs)
    report.rows = sum(histogram.values())
    report.rows_with_one_output = histogram.get(1, 0)
    report.max_outputs_per_row = max(histogram, default=0)
    report.outputs_per_row = dict(sorted(histogram.items()))
