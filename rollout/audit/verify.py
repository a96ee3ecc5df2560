"""`rollout verify`: regenerate a deterministic random sample of a finished run and compare.

The sample is drawn by seed from the run's output rows (so it is the same every time for
the same seed), regenerated through the same engine actor pool a job uses, from the same
input and job spec (job.json), into a scratch folder that is removed afterwards, then
compared with the stored rows exactly as `rollout audit` compares two runs.
"""

from __future__ import annotations

import math
import random
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from rollout import determinism
from rollout.audit.audit import attach_text, run_info
from rollout.audit.compare import ProgressFn, compare_streams
from rollout.audit.report import AuditReport, RunInfo
from rollout.audit.runs import RunDir, iter_rows, list_batches
from rollout.data.sources import Source
from rollout.errors import ConfigError
from rollout.jobs.config_diff import config_diff
from rollout.jobs.spec import JobSpec
from rollout.runtime.shard import ShardTask

DEFAULT_FRACTION = 0.01
MIN_DEFAULT_ROWS = 10


@dataclass(frozen=True)
class Sample:
    """Which rows to re-check: a fraction or a count of the run's output rows, and a seed."""

    fraction: float | None = None
    rows: int | None = None
    seed: int = 0

    def count(self, total: int) -> int:
        if self.rows is not None:
            if self.rows < 1:
                raise ConfigError("rows", self.rows, "must be >= 1")
            return min(self.rows, total)
        if self.fraction is not None:
            if not 0 < self.fraction <= 1:
                raise ConfigError("sample", self.fraction, "must be in (0, 1]")
            return min(total, max(1, math.ceil(self.fraction * total)))
        return min(total, max(MIN_DEFAULT_ROWS, math.ceil(DEFAULT_FRACTION * total)))

    def describe(self, count: int, total: int) -> str:
        return f"{count} of {total} rows ({100 * count / max(total, 1):.3g}%), seed {self.seed}"


@dataclass
class Plan:
    tasks: list[ShardTask]
    codes: np.ndarray  # the sampled keys as row_index * n + sample_index, sorted
    n: int
    lacking: int  # rows the manifest lists that the run's files do not hold
    files: list[Path]  # the stored shard files the sample draws from, in order


def plan_sample(run: RunDir, sample: Sample) -> Plan:
    """The shard tasks that regenerate the sample. Reads only the key columns of the run."""
    total = run.manifest.rows or 0
    count = sample.count(total)
    ordinals = np.array(sorted(random.Random(sample.seed).sample(range(total), count)), np.int64)
    n = int(run.manifest.config["n"])
    tasks, codes, files, offset, lacking = [], [], [], 0, 0
    for entry, (_, path) in zip(run.manifest.shards, run.shard_files(), strict=True):
        table = pa.Table.from_batches(list(list_batches(path, ["row_index", "sample_index"])))
        lacking += max(0, (entry.rows or 0) - table.num_rows)
        lo, hi = np.searchsorted(ordinals, [offset, offset + table.num_rows])
        offset += table.num_rows
        if lo == hi:
            continue
        local = ordinals[lo:hi] - (offset - table.num_rows)
        ri = table.column("row_index").to_numpy()[local]
        si = table.column("sample_index").to_numpy()[local]
        keys = tuple(zip(ri.tolist(), si.tolist(), strict=True))
        tasks.append(ShardTask(entry.shard_id, entry.start, entry.end, samples=keys,
                               determinism=run.determinism))  # fmt: skip
        files.append(path)
        codes.append(ri.astype(np.int64) * n + si)
    keys = np.concatenate(codes) if codes else np.zeros(0, np.int64)
    return Plan(tasks, keys, n, lacking, files)


def verify_run(
    run: RunDir,
    sample: Sample,
    actors: int | None = None,
    ray_address: str | None = None,
    scratch: str | Path | None = None,
    max_examples: int = 50,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    decode: bool = True,
) -> AuditReport:
    spec = JobSpec.model_validate(run.job_spec())
    plan = plan_sample(run, sample)
    tasks, codes, n = plan.tasks, plan.codes, plan.n
    total = run.manifest.rows or 0
    source = Source(spec.input.path, spec.input.format, spec.input.split)
    counts = source.row_counts()
    input_fp = source.fingerprint()
    folder = Path(tempfile.mkdtemp(prefix="rollout-verify-", dir=scratch))
    try:
        fingerprint = _regenerate(spec, tasks, len(codes), counts, folder, actors, ray_address,
                                  progress, cancel)  # fmt: skip
        config = spec.config_view(input_fp, fingerprint)
        report = AuditReport(
            "verify",
            run_info(run),
            RunInfo(
                label="regenerated",
                path=str(folder),
                config_hash=determinism.config_hash(config),
                run_digest="",
                rows=len(codes),
                engine=str(fingerprint.get("engine", "")),
            ),
            sample=sample.describe(len(codes), total),
        )
        report.config_diff = config_diff(run.manifest.config, config)
        report.config_equal = report.a.config_hash == report.b.config_hash
        report.missing_in_a = plan.lacking  # listed in the manifest, absent from the files

        def selected(batch: pa.RecordBatch) -> np.ndarray:
            ri = batch.column("row_index").to_numpy().astype(np.int64)
            return np.isin(ri * n + batch.column("sample_index").to_numpy(), codes)

        compare_streams(
            report,
            iter_rows(plan.files, run.determinism, f"run {run.label!r}", keep=selected),
            iter_rows(sorted(folder.glob("part-*.parquet")), run.determinism, "regenerated rows"),
            max_examples,
            progress,
            len(codes),
            cancel,
        )
        if decode:
            attach_text(report, run.manifest.engine)
        return report
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _regenerate(
    spec: JobSpec,
    tasks: list[ShardTask],
    rows: int,
    counts: list[int],
    folder: Path,
    actors: int | None,
    ray_address: str | None,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
) -> dict:
    """Run the sample's shard tasks on an engine pool; return the engines' fingerprint."""
    from rollout.runtime import cluster
    from rollout.runtime.pool import ShardPool

    cluster.connect(ray_address)
    pool = ShardPool.for_job(
        spec, str(folder), counts, max(1, min(actors or spec.pool.actors, len(tasks)))
    )
    try:
        fingerprint = pool.engine_fingerprint()
        done = 0
        if progress:
            progress("regenerate", 0, rows)
        for batch in pool.run(tasks, cancel):
            done += sum(result.rows for result in batch)
            if progress:
                progress("regenerate", done, rows)
        return fingerprint
    finally:
        pool.shutdown()
