"""Run a job: plan shards, resume what a previous run left, drive the pool, finish atomically.

Layout of a run directory:
  manifest.json   config_hash, engine fingerprint, shards (row range, rows, digest), run_digest
  shards.jsonl    shards recorded since the last manifest snapshot (a journal; see manifest.py)
  stats.json      timings and counters (they differ from run to run; never hashed)
  job.json        the job spec as run (what `rollout verify` regenerates rows with)
  data/           the Parquet shards, present only once the run is complete
  errors.jsonl    input rows left out (prompt.on_empty: skip), with the reason
  .incomplete/    shards of a run in progress; renamed to data/ in one step at the end,
                  so a reader never finds a partial data/ folder
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow.parquet as pq

from rollout import determinism
from rollout.audit.runs import verify_shard_file
from rollout.data.confined import fd_path, open_under_roots
from rollout.data.prompts import check_columns
from rollout.data.sink import ROW_GROUP_ROWS, file_sha256, fsync_dir
from rollout.data.sources import Source
from rollout.errors import ConfigError, InputError
from rollout.jobs.config_diff import config_diff
from rollout.jobs.spec import JobSpec
from rollout.runtime import cluster
from rollout.runtime.manifest import JOB, STATS, Manifest, ShardEntry, write_json_atomic
from rollout.runtime.recorder import record_batches, writing
from rollout.runtime.shard import ShardResult, ShardTask
from rollout.scoring.summary import SCORES, run_scores

log = logging.getLogger(__name__)

DATA = "data"
STAGING = ".incomplete"
ERRORS = "errors.jsonl"


@dataclass
class RunSummary:
    output: str
    config_hash: str
    run_digest: str
    input_rows: int
    rows: int
    skipped_rows: int
    shards: int
    shards_resumed: int
    prompt_tokens: int
    output_tokens: int
    seconds: float
    output_tokens_per_s: float
    actor_restarts: int
    backup_copies: int = 0  # straggling shards given a second copy (pool.backup_after)
    driver_cpu_s: float = 0.0  # CPU time of this (driver) process for the run
    actor_cpu_s: float = 0.0  # CPU time the actors spent on this run's shards, all together
    dispatch_latency_p50_ms: float = 0.0  # a finished shard seen -> its actor's next shard sent
    dispatch_latency_p99_ms: float = 0.0
    score_digest: str | None = None  # the job's scores (DETERMINISM.md v2); None: no scoring
    rows_generated: int = 0  # rows this run had the engine make (resumed shards not counted)
    rows_cached: int = 0  # rows this run took from the generation cache
    output_tokens_generated: int = 0  # output tokens the engine made (not from the cache)
    shard_retries: int = 0  # shards run again after their actor died


class Progress(Protocol):
    """What a runner reports to: the plan once, then each completed shard."""

    def start(self, manifest: Manifest) -> None: ...

    def shard_done(self, result: ShardResult, manifest: Manifest) -> None: ...


def plan_shards(total_rows: int, shard_size: int) -> list[ShardEntry]:
    return [
        ShardEntry(
            shard_id=i,
            start=s,
            end=min(s + shard_size, total_rows),
            file=ShardTask(i, 0, 0).file_name,
        )
        for i, s in enumerate(range(0, total_rows, shard_size))
    ]


ID_BUCKETS = 64
ID_SPILL = 1 << 22  # id hashes held in memory before the buckets spill to disk (32 MiB)


def check_unique_ids(source: Source, column: str, spill_dir: Path | None = None) -> None:
    """Every id in `column` is non-null and unique, in memory bounded by ID_SPILL.

    Each id's 64-bit hash goes to one of ID_BUCKETS buckets (spilled to temporary files
    past ID_SPILL hashes); a bucket at a time is then checked for repeats. A repeated
    hash is confirmed, and its rows found, by a second pass over the ids that have it.
    """
    import tempfile

    import numpy as np

    with tempfile.TemporaryDirectory(prefix="rollout-ids-", dir=spill_dir) as tmp:
        held: list[list[np.ndarray]] = [[] for _ in range(ID_BUCKETS)]
        count = row = 0
        for batch in source.read(0, source.num_rows, [column]):
            values = batch.column(0).to_pylist()
            if None in values:
                raise InputError(
                    f"input row {row + values.index(None)}", f"id column {column!r} is null"
                )
            hashes = np.fromiter((hash(v if isinstance(v, str) else str(v)) for v in values),
                                 dtype=np.int64, count=len(values))  # fmt: skip
            bucket = (hashes.view(np.uint64) % np.uint64(ID_BUCKETS)).astype(np.int64)
            for b in np.unique(bucket):
                held[b].append(hashes[bucket == b])
            count += len(values)
            row += len(values)
            if count >= ID_SPILL:
                _spill(held, Path(tmp))
                count = 0
        repeated: set[int] = set()
        for b in range(ID_BUCKETS):
            path = Path(tmp) / f"{b}.bin"
            parts = held[b] + ([np.fromfile(path, dtype=np.int64)] if path.exists() else [])
            if not parts:
                continue
            values, counts = np.unique(np.concatenate(parts), return_counts=True)
            repeated.update(values[counts > 1].tolist())
            held[b] = []
    if repeated:
        _report_duplicate(source, column, repeated)


def _spill(held: list[list], folder: Path) -> None:
    for b, parts in enumerate(held):
        if parts:
            with open(folder / f"{b}.bin", "ab") as f:
                for part in parts:
                    part.tofile(f)
            held[b] = []


def _report_duplicate(source: Source, column: str, hashes: set[int]) -> None:
    """Find the first real repeat among the ids whose hash repeats (a hash collision is not one)."""
    seen: dict[str, int] = {}
    row = 0
    for batch in source.read(0, source.num_rows, [column]):
        for value in batch.column(0).to_pylist():
            key = value if isinstance(value, str) else str(value)
            if hash(key) in hashes:
                if key in seen:
                    raise InputError(
                        f"id column {column!r}",
                        f"value {key!r} appears at rows {seen[key]} and {row}; ids must be unique",
                    )
                seen[key] = row
            row += 1


def _verify(path: str, version: str) -> tuple[str, int | None, str | None]:
    try:
        digest, rows = verify_shard_file(Path(path), version)
        return digest, rows, file_sha256(Path(path))
    except (OSError, ValueError) as exc:
        return str(exc), None, None


def verify_files(paths: list[Path], version: str) -> dict[str, tuple[str, int | None, str | None]]:
    """(shard_digest, rows, file sha256) of each file recomputed from its bytes, or (why not,
    None, None); run as Ray tasks, so that a resume's re-hashing is spread over the cluster,
    not the driver."""
    import ray

    task = ray.remote(num_cpus=1)(_verify)
    refs = [task.remote(str(p), version) for p in paths]
    return {p.name: r for p, r in zip(paths, ray.get(refs), strict=True)}


class JobRunner:
    def __init__(
        self,
        spec: JobSpec,
        ray_address: str | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        roots: Sequence[str] = (),
    ) -> None:
        self.spec = spec
        self.out = Path(spec.output).expanduser().resolve()  # named in messages
        self.io = self.out  # used for I/O: once locked under roots, the opened directory itself
        self.roots = tuple(roots)
        self._out_fd: int | None = None
        self.ray_address = ray_address
        self.progress = progress
        self.cancel = cancel

    def run(self) -> RunSummary:
        started = time.monotonic()
        self._cpu_started = time.process_time()
        spec = self.spec
        source = Source(spec.input.path, spec.input.format, spec.input.split, self.roots)
        check_columns(source.schema(), spec, where=f"input {spec.input.path!r}")
        counts = source.row_counts()
        if sum(counts) == 0:
            raise InputError(
                f"input {spec.input.path!r}", "has 0 rows; there is nothing to generate"
            )
        if spec.id_column:
            check_unique_ids(source, spec.id_column)
        existing = self._existing_manifest()
        with writing(self.out, "the output directory cannot be written"):
            self._lock()
        try:
            return self._run_locked(source, counts, existing, started)
        finally:
            self._lock_file.close()
            if self._out_fd is not None:
                os.close(self._out_fd)

    def _run_locked(
        self, source: Source, counts: list[int], existing: Manifest | None, started: float
    ) -> RunSummary:
        spec = self.spec
        input_fp = source.fingerprint()
        cluster.connect(self.ray_address)
        from rollout.runtime.pool import ShardPool

        if spec.cache:  # set up once here, before the actors open it together
            from rollout.cache import GenerationCache

            with writing(Path(spec.cache), "the generation cache cannot be opened"):
                GenerationCache(spec.cache).close()
        # Re-hash a previous run's complete shards before the engines take the CPUs.
        self._checks = self._verify_existing(existing)
        pool = ShardPool.for_job(spec, str(self.out / STAGING), counts, roots=self.roots)
        try:
            config = spec.config_view(input_fp, pool.engine_fingerprint(self.cancel))
            with writing(self.out, "the run could not be started"):
                manifest, resumed = self._prepare(
                    existing, config, determinism.config_hash(config), sum(counts)
                )
                write_json_atomic(self.io / JOB, spec.model_dump(mode="json"))
            if self.progress:
                self.progress.start(manifest)
            todo = [
                ShardTask(s.shard_id, s.start, s.end, determinism=manifest.determinism)
                for s in manifest.shards
                if not s.complete
            ]

            def recorded(result: ShardResult) -> None:
                self._count(result)
                if self.progress:
                    self.progress.shard_done(result, manifest)

            record_batches(self.io, manifest, pool.run(todo, self.cancel), recorded, self.out)
            with writing(self.out, "the finished run could not be written"):
                return self._finish(manifest, resumed, started, pool)
        finally:
            pool.shutdown()

    def _lock(self) -> None:
        """Hold `.lock` in the output directory for the whole run: one writer per directory."""
        if self.roots:  # made and opened under the roots without following symlinks
            self._out_fd = open_under_roots("output", str(self.out), self.roots, directory=True, create=True)  # fmt: skip
            self.io = Path(fd_path(self._out_fd) or self.out)
        else:
            self.out.mkdir(parents=True, exist_ok=True)
        # opened read-only: a lock held open for writing would keep the filesystem from
        # being remounted read-only (EBUSY) while a run holds it
        fd = os.open(self.io / ".lock", os.O_RDONLY | os.O_CREAT, 0o644)
        self._lock_file = os.fdopen(fd, "r")  # noqa: SIM115 - held while the runner lives
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            if self._out_fd is not None:
                os.close(self._out_fd)
            raise ConfigError(
                "output", str(self.out), "is being written by another rollout run"
            ) from None

    # -- resume --------------------------------------------------------------------------------
    def _verify_existing(
        self, existing: Manifest | None
    ) -> dict[str, tuple[str, int | None, str | None]]:
        if existing is None:
            return {}
        folder = self.io / (
            DATA if existing.status == "complete" and (self.io / DATA).is_dir() else STAGING
        )
        if not folder.is_dir() and (self.io / DATA).is_dir():
            folder = self.io / DATA
        complete = [folder / e.file for e in existing.shards if e.complete]
        return verify_files(complete, existing.determinism)

    def _existing_manifest(self) -> Manifest | None:
        if not self.out.exists():
            return None
        if not self.out.is_dir():
            raise ConfigError("output", str(self.out), "is a file, not a directory")
        manifest = Manifest.load(self.out)
        if manifest is None and any(p.name != ".lock" for p in self.out.iterdir()):
            raise ConfigError(
                "output",
                str(self.out),
                "is a non-empty directory that holds no rollout run (no manifest.json)",
            )
        return manifest

    def _prepare(
        self, existing: Manifest | None, config: dict, chash: str, total: int
    ) -> tuple[Manifest, int]:
        self._prompt_tokens = self._output_tokens = 0
        self._actor_cpu = 0.0
        self._rows_cached = self._rows_generated = self._tokens_generated = 0
        staging = self.io / STAGING
        if existing is None:
            manifest = Manifest(chash, config, config["engine"], total, self.spec.shard_size,
                                plan_shards(total, self.spec.shard_size),
                                determinism=determinism.CURRENT_VERSION)  # fmt: skip
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            manifest.save(self.io)
            return manifest, 0
        if existing.config_hash != chash:
            differ = ", ".join(d.path for d in config_diff(existing.config, config)) or "unknown"
            raise ConfigError(
                "output",
                str(self.out),
                f"holds a run of another config (config_hash {existing.config_hash[:12]}, this job "
                f"{chash[:12]}; differing fields: {differ}); choose another output directory",
            )
        if existing.status == "complete" and (self.io / DATA).is_dir():
            (self.io / DATA).rename(staging)  # re-verified below, renamed back at the end
            existing.status = "running"
        elif not staging.is_dir():
            if (self.io / DATA).is_dir():  # stopped between the rename and the manifest update
                (self.io / DATA).rename(staging)
            else:
                staging.mkdir()
        if existing.shard_size != self.spec.shard_size:
            log.info("resuming with the run's shard size %d (not %d)", existing.shard_size, self.spec.shard_size)  # fmt: skip
        keep = set()
        resumed = 0
        checks = self._checks
        for entry in existing.shards:
            if entry.complete:
                digest, rows, sha = checks.get(entry.file, ("not verified", None, None))
                ok = digest == entry.shard_digest and rows == entry.rows
                if ok and entry.file_sha256 and sha != entry.file_sha256:
                    ok, digest = False, "its bytes changed since it was written (file_sha256)"
                if ok:
                    keep.add(entry.file)
                    resumed += 1
                    continue
                log.warning(
                    "shard %d failed verification (%s); regenerating it", entry.shard_id, digest
                )
                entry.complete, entry.rows, entry.shard_digest = False, None, None
                entry.skipped, entry.file_sha256 = [], None
        for leftover in staging.iterdir():
            if leftover.name not in keep:
                leftover.unlink()
        existing.run_digest = existing.rows = None
        existing.save(self.io)
        return existing, resumed

    # -- finish --------------------------------------------------------------------------------
    def _count(self, result: ShardResult) -> None:
        self._prompt_tokens += result.prompt_tokens
        self._output_tokens += result.output_tokens
        self._actor_cpu += result.cpu_seconds
        self._rows_cached += result.rows_cached
        self._rows_generated += result.rows - result.rows_cached
        self._tokens_generated += result.output_tokens - result.tokens_cached

    def _finish(self, manifest: Manifest, resumed: int, started: float, pool: Any) -> RunSummary:
        staging = self.io / STAGING
        hashes_digest = determinism.run_digest(
            self._row_hashes(manifest, staging), manifest.determinism
        )
        manifest.rows = sum(s.rows or 0 for s in manifest.shards)
        skipped = [row for s in manifest.shards for row in s.skipped]
        tmp = self.io / f".{ERRORS}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for row in skipped:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, self.io / ERRORS)
        for stray in staging.glob(".*.tmp"):  # a write cut short (a killed backup copy)
            stray.unlink()
        staging.rename(self.io / DATA)
        fsync_dir(self.io)
        if self.spec.scoring:
            files = [self.io / DATA / e.file for e in manifest.shards]
            manifest.score_digest, scores = run_scores(self.spec, files)
            write_json_atomic(self.io / SCORES, scores)
        manifest.run_digest = hashes_digest
        manifest.status = "complete"
        manifest.save(self.io)
        seconds = time.monotonic() - started
        summary = RunSummary(
            output=str(self.out),
            config_hash=manifest.config_hash,
            run_digest=hashes_digest,
            input_rows=manifest.input_rows,
            rows=manifest.rows,
            skipped_rows=len(skipped),
            shards=len(manifest.shards),
            shards_resumed=resumed,
            prompt_tokens=self._prompt_tokens,
            output_tokens=self._output_tokens,
            seconds=seconds,
            output_tokens_per_s=self._output_tokens / seconds if seconds else 0.0,
            actor_restarts=pool.restarts,
            backup_copies=pool.backups,
            driver_cpu_s=time.process_time() - self._cpu_started,
            actor_cpu_s=self._actor_cpu,
            dispatch_latency_p50_ms=pool.dispatch_latency_ms(0.5),
            dispatch_latency_p99_ms=pool.dispatch_latency_ms(0.99),
            score_digest=manifest.score_digest,
            rows_generated=self._rows_generated,
            rows_cached=self._rows_cached,
            output_tokens_generated=self._tokens_generated,
            shard_retries=getattr(pool, "retries", 0),
        )
        write_json_atomic(self.io / STATS, asdict(summary))
        return summary

    @staticmethod
    def _row_hashes(manifest: Manifest, folder: Path):
        for entry in manifest.shards:  # shards are row ranges in order
            shard = pq.ParquetFile(folder / entry.file)
            for batch in shard.iter_batches(batch_size=ROW_GROUP_ROWS, columns=["row_hash"]):
                yield from batch.column(0).to_pylist()  # one row group at a time: flat memory
