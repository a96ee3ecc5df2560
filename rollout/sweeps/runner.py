"""Running a sweep here: every cell a job, one after another on one Ray runtime, sharing a
generation cache, so that a cell equal to an earlier one (or overlapping it) generates
only its new rows. A sweep resumes like a job: run it again and complete cells are kept,
unfinished ones resume, and the cache serves what was generated before.

DIR/
  sweep.json          the sweep: its spec, cells (settings, state, digests, row counts),
                      and, once every cell is done, its digest
  cells/<cell_id>/    each cell's run directory
  cache/              the generation cache (unless the spec names another)
  report.json, report.md, report.html
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rollout.audit.runs import RunDir
from rollout.errors import InputError, RolloutError
from rollout.runtime.manifest import write_json_atomic
from rollout.sweeps.spec import Cell, SweepSpec, cache_dir, cell_job, expand

SWEEP = "sweep.json"


@dataclass
class CellState:
    cell_id: str
    settings: dict[str, Any]
    state: str = "pending"  # pending | running | done | failed | cancelled
    config_hash: str = ""
    run_digest: str = ""
    score_digest: str = ""
    rows: int = 0
    rows_generated: int = 0
    rows_cached: int = 0
    seconds: float = 0.0
    error: str = ""
    kept: bool = False  # complete before this invocation: nothing was run


@dataclass
class SweepState:
    name: str
    spec: dict[str, Any]
    cells: list[CellState]
    state: str = "running"  # running | done | failed | cancelled
    digest: str = ""
    started_at: float = field(default_factory=time.time)
    finished_at: float = 0.0

    @property
    def rows_generated(self) -> int:
        return sum(c.rows_generated for c in self.cells)

    @property
    def rows_cached(self) -> int:
        return sum(c.rows_cached for c in self.cells)


def sweep_digest(cells: list[CellState]) -> str:
    """sha256 over the cells in id order: id, config_hash, run_digest and score digest each."""
    h = hashlib.sha256(b"rollout-sweep-v1\n")
    for c in sorted(cells, key=lambda c: c.cell_id):
        h.update(f"{c.cell_id}\t{c.config_hash}\t{c.run_digest}\t{c.score_digest}\n".encode())
    return h.hexdigest()


class SweepProgress(Protocol):
    def cell_started(self, sweep: SweepState, cell: CellState, rows: int) -> None: ...
    def rows_done(self, sweep: SweepState, rows: int) -> None: ...
    def cell_finished(self, sweep: SweepState, cell: CellState) -> None: ...


class _CellProgress:
    """A job runner's progress (rollout.runtime.runner.Progress) fed into the sweep's."""

    def __init__(self, sweep: SweepState, cell: CellState, progress: SweepProgress | None) -> None:
        self.sweep, self.cell, self.progress = sweep, cell, progress

    def start(self, manifest: Any) -> None:
        if self.progress:
            total = manifest.input_rows * int(manifest.config.get("n", 1))
            self.progress.cell_started(self.sweep, self.cell, total)

    def shard_done(self, result: Any, manifest: Any) -> None:
        self.cell.rows_cached += result.rows_cached
        self.cell.rows_generated += result.rows - result.rows_cached
        if self.progress:
            self.progress.rows_done(self.sweep, result.rows)


def load_state(output: Path) -> SweepState | None:
    path = output / SWEEP
    if not path.exists():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    data["cells"] = [CellState(**c) for c in data["cells"]]
    return SweepState(**data)


def complete_cell(job_output: Path, job: dict[str, Any]) -> RunDir | None:
    """The cell's run, if it is complete and ran this very job."""
    try:
        run = RunDir(job_output)
        recorded = run.job_spec()
    except (InputError, OSError, ValueError):
        return None
    return run if recorded == job else None


class SweepRunner:
    def __init__(self, spec: SweepSpec, base: dict[str, Any], output: str | Path,
                 ray_address: str | None = None, progress: SweepProgress | None = None,
                 cancel: threading.Event | None = None) -> None:  # fmt: skip
        self.spec, self.base = spec, base
        self.output = Path(output).expanduser().resolve()
        self.ray_address, self.progress, self.cancel = ray_address, progress, cancel
        self.cells: list[Cell] = expand(spec, base)

    def run(self) -> SweepState:
        from rollout.runtime.runner import JobRunner

        self.output.mkdir(parents=True, exist_ok=True)
        cache = cache_dir(self.spec, self.output)
        jobs = {c.cell_id: cell_job(c, self.output, cache) for c in self.cells}
        sweep = SweepState(self.spec.name, self.spec.model_dump(mode="json"),
                           [CellState(c.cell_id, c.settings) for c in self.cells])  # fmt: skip
        self._save(sweep)
        try:
            for cell, state in zip(self.cells, sweep.cells, strict=True):
                if self.cancel is not None and self.cancel.is_set():
                    state.state = "cancelled"
                    continue
                job = jobs[cell.cell_id]
                done = complete_cell(Path(job.output), job.model_dump(mode="json"))
                if done is not None:  # resumed sweep: nothing to do for this cell
                    self._record(state, done, kept=True)
                    if self.progress:
                        self.progress.cell_finished(sweep, state)
                    continue
                state.state = "running"
                self._save(sweep)
                started = time.monotonic()
                try:
                    summary = JobRunner(job, self.ray_address, progress=_CellProgress(sweep, state, self.progress),
                                        cancel=self.cancel).run()  # fmt: skip
                except RolloutError as exc:
                    state.state, state.error = "failed", str(exc)
                    sweep.state = "failed"
                    self._save(sweep)
                    raise
                state.rows_generated, state.rows_cached = (
                    summary.rows_generated,
                    summary.rows_cached,
                )
                self._record(state, RunDir(job.output), kept=False)
                state.seconds = time.monotonic() - started
                self._save(sweep)
                if self.progress:
                    self.progress.cell_finished(sweep, state)
        finally:
            if sweep.state == "running" and any(c.state == "cancelled" for c in sweep.cells):
                sweep.state = "cancelled"
                self._save(sweep)
        sweep.digest = sweep_digest(sweep.cells)
        sweep.state, sweep.finished_at = "done", time.time()
        self._save(sweep)
        return sweep

    @staticmethod
    def _record(state: CellState, run: RunDir, kept: bool) -> None:
        m = run.manifest
        state.state, state.kept = "done", kept
        state.config_hash, state.run_digest = m.config_hash, m.run_digest or ""
        state.score_digest, state.rows = m.score_digest or "", m.rows or 0

    def _save(self, sweep: SweepState) -> None:
        write_json_atomic(self.output / SWEEP, asdict(sweep))
