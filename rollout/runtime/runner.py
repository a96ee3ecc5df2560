"""Run a job: plan shards, resume what a previous run left, drive the pool, finish atomically.

Layout of a run directory:
  manifest.json   config_hash, engine fingerprint, shards (row range, rows, digest), run_digest
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
import os
import shutil
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

import pyarrow.parquet as pq

from rollout import determinism
from rollout.data.prompts import check_columns
from rollout.data.sink import fsync_dir, verify_shard_file
from rollout.data.sources import Source
from rollout.errors import ConfigError, InputError
from rollout.jobs.config_diff import config_diff
from rollout.jobs.spec import JobSpec
from rollout.runtime.manifest import JOB, STATS, Manifest, ShardEntry, write_json_atomic
from rollout.runtime.shard import ShardResult, ShardTask

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


def check_unique_ids(source: Source, column: str) -> None:
    seen: dict[str, int] = {}
    row = 0
    for batch in source.read(0, source.num_rows, [column]):
        for value in batch.column(0).to_pylist():
            if value is None:
                raise InputError(f"input row {row}", f"id column {column!r} is null")
            key = value if isinstance(value, str) else str(value)
            if key in seen:
                raise InputError(
                    f"id column {column!r}",
                    f"value {key!r} appears at rows {seen[key]} and {row}; ids must be unique",
                )
            seen[key] = row
            row += 1


def connect_ray(address: str | None) -> None:
    """Join the Ray cluster at `address`, or start a local runtime (once per process)."""
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, logging_level="ERROR")
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(
            num_cpus=os.cpu_count(),
            object_store_memory=256 * 1024 * 1024,
            include_dashboard=False,
            logging_level="ERROR",
        )


class JobRunner:
    def __init__(
        self,
        spec: JobSpec,
        ray_address: str | None = None,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.spec = spec
        self.out = Path(spec.output).expanduser().resolve()
        self.ray_address = ray_address
        self.progress = progress
        self.cancel = cancel

    def run(self) -> RunSummary:
        started = time.monotonic()
        spec = self.spec
        source = Source(spec.input.path, spec.input.format, spec.input.split)
        check_columns(source.schema(), spec, where=f"input {spec.input.path!r}")
        counts = source.row_counts()
        if sum(counts) == 0:
            raise InputError(
                f"input {spec.input.path!r}", "has 0 rows; there is nothing to generate"
            )
        if spec.id_column:
            check_unique_ids(source, spec.id_column)
        existing = self._existing_manifest()
        self._lock()
        try:
            return self._run_locked(source, counts, existing, started)
        finally:
            self._lock_file.close()

    def _run_locked(
        self, source: Source, counts: list[int], existing: Manifest | None, started: float
    ) -> RunSummary:
        spec = self.spec
        input_fp = source.fingerprint()
        connect_ray(self.ray_address)
        from rollout.runtime.pool import ShardPool

        pool = ShardPool.for_job(spec, str(self.out / STAGING), counts)
        try:
            config = spec.config_view(input_fp, pool.engine_fingerprint())
            manifest, resumed = self._prepare(
                existing, config, determinism.config_hash(config), sum(counts)
            )
            write_json_atomic(self.out / JOB, spec.model_dump(mode="json"))
            if self.progress:
                self.progress.start(manifest)
            by_id = {s.shard_id: s for s in manifest.shards}
            todo = [
                ShardTask(s.shard_id, s.start, s.end) for s in manifest.shards if not s.complete
            ]
            for result in pool.run(todo, self.cancel):
                entry = by_id[result.shard_id]
                entry.complete = True
                entry.rows, entry.shard_digest = result.rows, result.shard_digest
                entry.skipped = result.skipped
                manifest.save(self.out)
                self._count(result)
                if self.progress:
                    self.progress.shard_done(result, manifest)
            return self._finish(manifest, resumed, started, pool.restarts)
        finally:
            pool.shutdown()

    def _lock(self) -> None:
        """Hold `.lock` in the output directory for the whole run: one writer per directory."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.out / ".lock", "a+")  # noqa: SIM115 - held while the runner lives
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise ConfigError(
                "output", str(self.out), "is being written by another rollout run"
            ) from None

    # -- resume --------------------------------------------------------------------------------
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
        self.out.mkdir(parents=True, exist_ok=True)
        staging = self.out / STAGING
        if existing is None:
            manifest = Manifest(chash, config, config["engine"], total, self.spec.shard_size,
                                plan_shards(total, self.spec.shard_size))  # fmt: skip
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            manifest.save(self.out)
            return manifest, 0
        if existing.config_hash != chash:
            differ = ", ".join(d.path for d in config_diff(existing.config, config)) or "unknown"
            raise ConfigError(
                "output",
                str(self.out),
                f"holds a run of another config (config_hash {existing.config_hash[:12]}, this job "
                f"{chash[:12]}; differing fields: {differ}); choose another output directory",
            )
        if existing.status == "complete" and (self.out / DATA).is_dir():
            (self.out / DATA).rename(staging)  # re-verified below, renamed back at the end
            existing.status = "running"
        elif not staging.is_dir():
            if (self.out / DATA).is_dir():  # stopped between the rename and the manifest update
                (self.out / DATA).rename(staging)
            else:
                staging.mkdir()
        if existing.shard_size != self.spec.shard_size:
            print(f"[rollout] resuming with the run's shard size {existing.shard_size} "
                  f"(not {self.spec.shard_size})", file=sys.stderr)  # fmt: skip
        keep = set()
        resumed = 0
        for entry in existing.shards:
            path = staging / entry.file
            if entry.complete:
                try:
                    digest, rows = verify_shard_file(path)
                    ok = digest == entry.shard_digest and rows == entry.rows
                except (OSError, ValueError) as exc:
                    ok, digest = False, str(exc)
                if ok:
                    keep.add(entry.file)
                    resumed += 1
                    continue
                print(f"[rollout] shard {entry.shard_id} failed verification ({digest}); regenerating it",
                      file=sys.stderr)  # fmt: skip
                entry.complete, entry.rows, entry.shard_digest, entry.skipped = (
                    False,
                    None,
                    None,
                    [],
                )
        for leftover in staging.iterdir():
            if leftover.name not in keep:
                leftover.unlink()
        existing.run_digest = existing.rows = None
        existing.save(self.out)
        return existing, resumed

    # -- finish --------------------------------------------------------------------------------
    def _count(self, result: ShardResult) -> None:
        self._prompt_tokens += result.prompt_tokens
        self._output_tokens += result.output_tokens

    def _finish(
        self, manifest: Manifest, resumed: int, started: float, restarts: int
    ) -> RunSummary:
        staging = self.out / STAGING
        hashes_digest = determinism.run_digest(self._row_hashes(manifest, staging))
        manifest.rows = sum(s.rows or 0 for s in manifest.shards)
        skipped = [row for s in manifest.shards for row in s.skipped]
        tmp = self.out / f".{ERRORS}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for row in skipped:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, self.out / ERRORS)
        staging.rename(self.out / DATA)
        fsync_dir(self.out)
        manifest.run_digest = hashes_digest
        manifest.status = "complete"
        manifest.save(self.out)
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
            actor_restarts=restarts,
        )
        write_json_atomic(self.out / STATS, asdict(summary))
        return summary

    @staticmethod
    def _row_hashes(manifest: Manifest, folder: Path):
        for entry in manifest.shards:  # shards are row ranges in order
            yield from (
                pq.read_table(folder / entry.file, columns=["row_hash"]).column(0).to_pylist()
            )
