"""Sweeps in the service: a sweep's cells are validated like any job, then queued as jobs
(request ids `<sweep_id>/<cell_id>`, so a resubmission never queues a cell twice); the
sweep's state is read from its cells' jobs. When every cell has succeeded, the service
writes the report into the sweep's folder and keeps its digest and Markdown."""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rollout.audit.runs import RunDir
from rollout.data.sources import Source
from rollout.errors import ConfigError, Conflict
from rollout.service.manager import JobManager, NotFound, resolve_under_roots
from rollout.service.store import FINAL, SweepRecord
from rollout.sweeps.report import build_report, render_markdown, write_report
from rollout.sweeps.runner import CellState, sweep_digest
from rollout.sweeps.spec import cache_dir, cell_job_data, expand, parse_sweep


class SweepService:
    def __init__(self, manager: JobManager) -> None:
        self.manager = manager
        self.store = manager.store

    def submit(self, data: dict[str, Any], output: str, request_id: str | None) -> SweepRecord:
        spec = parse_sweep(data)
        if not isinstance(spec.base, dict):
            raise ConfigError("sweep.base", spec.base, "must be the job spec itself on the service (rollout sweep --server inlines a base file)")  # fmt: skip
        out = resolve_under_roots("output", output, self.manager.roots)
        if request_id:
            found = self.store.sweep_by_request(request_id)
            if found is not None:
                if found.spec != spec.model_dump(mode="json") or found.output != out:
                    raise Conflict(f"request_id {request_id!r} was used for sweep {found.sweep_id} with another spec or output")  # fmt: skip
                return found
        cache = cache_dir(spec, Path(out))
        sweep_id = hashlib.sha256(request_id.encode()).hexdigest()[:16] if request_id else uuid.uuid4().hex[:16]  # fmt: skip
        cells, jobs = [], []
        for cell in expand(spec, dict(spec.base)):
            validated = self.manager.validate(
                cell_job_data(cell, Path(out), cache)
            )  # every cell, before any is queued
            rows = Source(validated.input.path, validated.input.format, validated.input.split).num_rows  # fmt: skip
            jobs.append((cell.cell_id, validated))
            cells.append({"cell_id": cell.cell_id, "settings": cell.settings, "rows_total": rows * validated.n})  # fmt: skip
        for entry, (cid, validated) in zip(cells, jobs, strict=True):
            record, _ = self.store.submit(validated.model_dump(mode="json"), validated.output, f"{sweep_id}/{cid}")  # fmt: skip
            entry["job_id"] = record.job_id
        record = SweepRecord(sweep_id, request_id, spec.model_dump(mode="json"), out, cells, time.time())  # fmt: skip
        self.store.add_sweep(record)
        self.manager._notify()
        return record

    def get(self, sweep_id: str) -> tuple[SweepRecord, str, list[Any]]:
        """The sweep, its state, and its cells' job records (finishing it when it is done)."""
        record = self.store.get_sweep(sweep_id)
        if record is None:
            raise NotFound(f"no sweep {sweep_id!r}")
        jobs = [self.manager.get(c["job_id"]) for c in record.cells]
        states = {j.state for j in jobs}
        if states <= set(FINAL):
            if states == {"SUCCEEDED"}:
                state = "SUCCEEDED"
                if not record.digest:
                    record = self._finish(record)
            else:
                state = "FAILED" if "FAILED" in states else "CANCELLED"
        else:
            state = "RUNNING" if states - {"QUEUED"} else "QUEUED"
        return record, state, jobs

    def _finish(self, record: SweepRecord) -> SweepRecord:
        out = Path(record.output)
        cells = []
        for c in record.cells:
            m = RunDir(out / "cells" / c["cell_id"]).manifest
            job = self.manager.get(c["job_id"])
            cached = int(job.progress.get("rows_cached", 0))
            cells.append(CellState(c["cell_id"], c["settings"], "done", m.config_hash, m.run_digest or "",
                                   m.score_digest or "", m.rows or 0, (m.rows or 0) - cached, cached))  # fmt: skip
        digest = sweep_digest(cells)
        sweep = {"name": record.spec.get("name", "sweep"), "digest": digest, "cells": [asdict(c) for c in cells]}  # fmt: skip
        report = build_report(out, sweep, record.spec.get("baseline"))
        write_report(out, report)
        self.store.finish_sweep(record.sweep_id, digest, {"markdown": render_markdown(report)})
        return self.store.get_sweep(record.sweep_id) or record

    def cancel(self, sweep_id: str) -> None:
        record, _, jobs = self.get(sweep_id)
        for job in jobs:
            if job.state not in FINAL:
                self.manager.cancel(job.job_id)
