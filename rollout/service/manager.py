"""Runs submitted jobs: validation, data roots, a queue in submission order, cancellation, watchers.

Jobs run in threads of the service process, which owns the Ray driver; how many run at
once is `max_concurrent`. Every change is written to the job store first, then
announced to watchers. On start, jobs a previous process left RUNNING go back to the
queue and resume through the run directory (complete shards kept).
"""

from __future__ import annotations

import threading
import time
import traceback
from pathlib import Path
from typing import Any

from rollout.data.prompts import check_columns
from rollout.data.sources import Source
from rollout.engines import engine_class
from rollout.errors import (
    AccessError,
    ClusterLost,
    ConfigError,
    InputError,
    JobCancelled,
    RolloutError,
)
from rollout.jobs.spec import JobSpec, parse_job_spec
from rollout.runtime import cluster
from rollout.runtime.runner import JobRunner
from rollout.scoring.registry import build, check_allowed
from rollout.service.store import JobRecord, JobStore


class NotFound(RolloutError):
    pass


MAX_PATH = 4096  # characters, as Linux's PATH_MAX


def resolve_under_roots(parameter: str, value: str, roots: list[Path]) -> str:
    """The absolute path of `value` (relative paths are under the first root), if it lies
    under one of `roots` once `..` and symlinks are resolved; else AccessError."""
    if "\0" in value:
        raise InputError(parameter, "holds a NUL byte, which no path can")
    if len(value) > MAX_PATH:
        raise InputError(parameter, f"is {len(value)} characters long; at most {MAX_PATH}")
    if "://" in value:
        raise AccessError(parameter, value, "URIs are not served; use a path under a data root")
    path = Path(value)
    if not path.is_absolute():
        path = roots[0] / path
    real = path.resolve()
    for root in roots:
        if real == root or root in real.parents:
            return str(real)
    raise AccessError(
        parameter,
        value,
        f"resolves to {real}, outside the data roots ({', '.join(map(str, roots))})",
    )


def check_job_paths(job: JobSpec, roots: list[Path]) -> JobSpec:
    """The job with its input and output resolved under the data roots, every input file it
    will read (through a folder or a glob) checked too, no output inside another run, and
    every path-like engine option under the roots; AccessError naming what is not. Run at
    submit and again when the job starts (a file swapped for a symlink in between is caught)."""
    inp = resolve_under_roots("input.path", job.input.path, roots)
    out = resolve_under_roots("output", job.output, roots)
    cache = resolve_under_roots("cache", job.cache, roots) if job.cache else None
    for name in engine_class(job.engine.name).path_options():
        value = job.engine.options.get(name)
        if value:
            resolve_under_roots(f"engine.options.{name}", str(value), roots)
    for parent in Path(out).parents:
        if (parent / "manifest.json").is_file():
            raise AccessError("output", job.output, f"lies inside the run at {parent}: choose a folder outside other runs")  # fmt: skip
        if any(parent == r for r in roots):
            break
    job = job.model_copy(
        update={"input": job.input.model_copy(update={"path": inp}), "output": out, "cache": cache}
    )
    source = Source(job.input.path, job.input.format, job.input.split)
    # what a folder or a glob yields: each file, symlinks resolved
    check_files_under_roots("input.path", job.input.path, [f.path for f in source.files], roots)
    return job


def check_files_under_roots(
    parameter: str, named: str, files: list[str], roots: list[Path]
) -> None:
    """Every file that `named` (a folder, a glob, a run) leads to lies under the roots, once
    symlinks are resolved; else AccessError naming the file."""
    for path in files:
        try:
            resolve_under_roots(parameter, path, roots)
        except AccessError as exc:
            raise AccessError(parameter, named, f"holds {path}, which {exc.reason}") from None


class JobManager:
    def __init__(
        self,
        store: JobStore,
        data_roots: list[Path],
        max_concurrent: int = 1,
        ray_address: str | None = None,
        allowed_scorers: tuple[str, ...] = (),
    ) -> None:
        self.store = store
        # the modules whose user scorers (module:function) jobs may name (--allow-scorer)
        self.allowed_scorers = tuple(allowed_scorers)
        self.metrics: Any = None  # rollout.service.metrics.Metrics, with --metrics-address
        self.roots = [r.resolve() for r in data_roots]
        self.max_concurrent = max_concurrent
        self.ray_address = ray_address
        self.changed = threading.Condition()
        self._cancel: dict[str, threading.Event] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._stop = threading.Event()
        self._scheduler = threading.Thread(
            target=self._schedule, name="rollout-scheduler", daemon=True
        )

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> list[str]:
        resumed = self.store.requeue_interrupted()
        self._scheduler.start()
        return resumed

    def stop(self, timeout: float = 120.0) -> None:
        """Stop taking jobs; running ones stop after their current step and go back to QUEUED."""
        self._stop.set()
        for event in list(self._cancel.values()):
            event.set()
        self._notify()
        self._scheduler.join(timeout)
        for thread in list(self._threads.values()):
            thread.join(timeout)

    # -- API ------------------------------------------------------------------------------------
    def validate(self, spec: dict[str, Any]) -> JobSpec:
        """The spec, its paths under the data roots, and its input's files and columns."""
        job = parse_job_spec(spec)
        for entry in job.scoring:  # before anything imports a user scorer's module
            check_allowed(entry.scorer, self.allowed_scorers, f"scoring.{entry.name}.scorer")
            build(entry.name, entry.scorer, entry.options).close()  # options checked
        engine_class(job.engine.name)(**job.engine.options)  # options checked; nothing started
        job = check_job_paths(job, self.roots)
        import ray

        if ray.is_initialized():  # actors no node can hold would wait forever: refuse now
            p = job.pool
            cluster.pool_size(p.actors, p.cpus_per_actor, p.gpus_per_actor, 1)
        out = job.output
        if Path(out).exists() and not Path(out).is_dir():
            raise ConfigError("output", out, "is a file, not a directory")
        source = Source(job.input.path, job.input.format, job.input.split)
        check_columns(source.schema(), job, where=f"input {job.input.path!r}")
        return job

    def submit(self, spec: dict[str, Any], request_id: str | None) -> JobRecord:
        job = self.validate(spec)
        record, created = self.store.submit(job.model_dump(mode="json"), job.output, request_id)
        if created:
            self._notify()
        return record

    def get(self, job_id: str) -> JobRecord:
        record = self.store.get(job_id)
        if record is None:
            raise NotFound(f"no job {job_id!r}")
        return record

    def cancel(self, job_id: str) -> JobRecord:
        record = self.get(job_id)
        if record.state == "QUEUED":
            self.store.update(
                job_id, state="CANCELLED", finished_at=time.time(), cancel_requested=1
            )
        elif record.state == "RUNNING":
            self.store.update(job_id, cancel_requested=1)
            event = self._cancel.get(job_id)
            if event:
                event.set()
        self._notify()
        return self.get(job_id)

    def run_dir(self, ref: str, parameter: str):
        """A finished run named by a job id of this service or a directory under a data root."""
        from rollout.audit.runs import RunDir

        if not ref:
            raise InputError(parameter, "is empty: name a job id or a run directory")
        record = self.store.get(ref)
        path = record.output if record is not None else ref
        run = RunDir(resolve_under_roots(parameter, path, self.roots), label=ref)
        shards = [str(shard) for _, shard in run.shard_files()]  # each file it will read
        check_files_under_roots(parameter, ref, shards, self.roots)
        return run

    def orphaned_runs(self, limit: int = 3) -> list[Path]:
        """Run folders under the data roots (two levels down) that no job of an empty store
        names: a sign that the store was lost or replaced."""
        if not self.store.is_empty():
            return []
        found = [m.parent for root in self.roots for pattern in ("*/manifest.json", "*/*/manifest.json")
                 for m in root.glob(pattern)]  # fmt: skip
        return sorted(found)[:limit]

    def wait_for_change(self, timeout: float) -> None:
        with self.changed:
            self.changed.wait(timeout)

    # -- running ----------------------------------------------------------------------------------
    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def _schedule(self) -> None:
        while not self._stop.is_set():
            self._threads = {k: t for k, t in self._threads.items() if t.is_alive()}
            record = self.store.next_queued() if len(self._threads) < self.max_concurrent else None
            if record is None:
                self.wait_for_change(0.5)
                continue
            self.store.update(record.job_id, state="RUNNING", started_at=time.time(), error="")
            self._cancel[record.job_id] = threading.Event()
            thread = threading.Thread(
                target=self._run, args=(record,), name=f"job-{record.job_id}", daemon=True
            )
            self._threads[record.job_id] = thread
            thread.start()
            self._notify()

    def _run(self, record: JobRecord) -> None:
        job_id = record.job_id
        try:
            # the paths again: what was checked at submit may have changed while it queued
            spec = check_job_paths(JobSpec.model_validate(record.spec), self.roots)
            runner = JobRunner(
                spec,
                self.ray_address,
                progress=_StoreProgress(self, job_id),
                cancel=self._cancel[job_id],
                roots=tuple(map(str, self.roots)),
            )
            summary = runner.run()
            self.store.update(job_id, state="SUCCEEDED", finished_at=time.time(), run_digest=summary.run_digest,
                              config_hash=summary.config_hash)  # fmt: skip
            if self.metrics is not None:
                self.metrics.job_finished("SUCCEEDED", summary)
        except JobCancelled:
            if self._stop.is_set():  # the service is stopping: the job resumes at the next start
                self.store.update(job_id, state="QUEUED")
            else:
                self.store.update(job_id, state="CANCELLED", finished_at=time.time())
        except ClusterLost as exc:  # the next job joins the runtime anew
            self.store.update(job_id, state="FAILED", finished_at=time.time(), error=str(exc))
            from rollout.runtime import cluster

            cluster.disconnect()
        except RolloutError as exc:
            self.store.update(job_id, state="FAILED", finished_at=time.time(), error=str(exc))
        except Exception as exc:  # a bug, not the user's input: say so, keep the trace
            detail = "".join(traceback.format_exception_only(exc)).strip()
            self.store.update(
                job_id, state="FAILED", finished_at=time.time(), error=f"internal error: {detail}"
            )
            traceback.print_exc()
        finally:
            self._cancel.pop(job_id, None)
            if self.metrics is not None:
                final = self.store.get(job_id)
                if final is not None and final.state in ("FAILED", "CANCELLED"):
                    self.metrics.job_finished(final.state)
            self._notify()


class _StoreProgress:
    """Writes a running job's progress to the store and wakes watchers. Counts are taken
    from the manifest once, then kept up shard by shard (O(1) per shard)."""

    def __init__(self, manager: JobManager, job_id: str) -> None:
        self.manager, self.job_id = manager, job_id
        self.started = time.monotonic()
        self.tokens = self.rows = self.done = self.total = self.cached = 0

    def start(self, manifest) -> None:
        self.started = time.monotonic()
        self.done, self.total = manifest.done, len(manifest.shards)
        self.rows = sum(s.rows or 0 for s in manifest.shards if s.complete)  # resumed shards
        self.manager.store.update(self.job_id, progress=self._progress())
        self.manager._notify()

    def shard_done(self, result, manifest) -> None:
        self.tokens += result.output_tokens
        self.rows += result.rows
        self.cached += result.rows_cached
        if self.manager.metrics is not None:
            self.manager.metrics.shard_done(result)
        self.done += 1
        self.manager.store.update(self.job_id, progress=self._progress())
        self.manager._notify()

    def _progress(self) -> dict:
        seconds = max(time.monotonic() - self.started, 1e-9)
        return {"shards_done": self.done, "shards_total": self.total, "rows": self.rows,
                "output_tokens": self.tokens, "output_tokens_per_s": self.tokens / seconds,
                "rows_cached": self.cached}  # fmt: skip
