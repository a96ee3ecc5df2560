"""The durable job store: one SQLite file holding every job's spec, state, progress and error."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.errors import ConfigError, Conflict, shorten

STATES = ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL UNIQUE,
    request_id TEXT UNIQUE,
    spec TEXT NOT NULL,
    output TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL NOT NULL DEFAULT 0,
    finished_at REAL NOT NULL DEFAULT 0,
    progress TEXT NOT NULL DEFAULT '{}',
    error TEXT NOT NULL DEFAULT '',
    config_hash TEXT NOT NULL DEFAULT '',
    run_digest TEXT NOT NULL DEFAULT '',
    cancel_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, seq);
CREATE TABLE IF NOT EXISTS sweeps (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    sweep_id TEXT NOT NULL UNIQUE,
    request_id TEXT UNIQUE,
    spec TEXT NOT NULL,
    output TEXT NOT NULL,
    cells TEXT NOT NULL,
    created_at REAL NOT NULL,
    digest TEXT NOT NULL DEFAULT '',
    report TEXT NOT NULL DEFAULT ''
);
"""


@dataclass
class JobRecord:
    seq: int
    job_id: str
    request_id: str | None
    spec: dict[str, Any]
    output: str
    state: str
    created_at: float
    started_at: float = 0.0
    finished_at: float = 0.0
    progress: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    config_hash: str = ""
    run_digest: str = ""
    cancel_requested: bool = False


@dataclass
class SweepRecord:
    sweep_id: str
    request_id: str | None
    spec: dict[str, Any]
    output: str
    cells: list[dict[str, Any]]  # cell_id, settings, job_id
    created_at: float
    digest: str = ""
    report: dict[str, Any] = field(default_factory=dict)


class JobStore:
    """Thread-safe access to the jobs table (one connection, serialized by a lock)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(
                "--state-dir",
                str(path.parent),
                f"the job store {path} cannot be read ({exc}); it is damaged or not a rollout "
                "job store. Move it aside (the run folders it named are kept, and a job "
                "resubmitted into one resumes it) and start again",
            ) from None
        self._lock = threading.Lock()

    def count_by_state(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())  # fmt: skip

    def is_empty(self) -> bool:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _row(self, row: tuple) -> JobRecord:
        (seq, job_id, request_id, spec, output, state, created, started, finished,
         progress, error, chash, digest, cancel) = row  # fmt: skip
        return JobRecord(seq, job_id, request_id, json.loads(spec), output, state, created, started,
                         finished, json.loads(progress), error, chash, digest, bool(cancel))  # fmt: skip

    def submit(
        self, spec: dict[str, Any], output: str, request_id: str | None
    ) -> tuple[JobRecord, bool]:
        """Insert a QUEUED job; with a known request_id, return that job instead (created=False)."""
        with self._lock:
            if request_id:
                found = self._db.execute(
                    "SELECT * FROM jobs WHERE request_id = ?", (request_id,)
                ).fetchone()
                if found:
                    record = self._row(found)
                    if record.spec != json.loads(json.dumps(spec, ensure_ascii=False)):
                        raise Conflict(
                            f"request_id {shorten(request_id)} was used for job {record.job_id} "
                            "with another spec; use a new request_id for a new job"
                        )
                    return record, False
            job_id = uuid.uuid4().hex[:16]
            self._db.execute(
                "INSERT INTO jobs (job_id, request_id, spec, output, state, created_at) VALUES (?, ?, ?, ?, 'QUEUED', ?)",
                (
                    job_id,
                    request_id or None,
                    json.dumps(spec, ensure_ascii=False),
                    output,
                    time.time(),
                ),
            )
            row = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            return self._row(row), True

    def get(self, job_id: str) -> JobRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return self._row(row) if row else None

    def list(self, states: list[str], after_seq: int, limit: int) -> list[JobRecord]:
        query = "SELECT * FROM jobs WHERE seq > ?"
        args: list[Any] = [after_seq]
        if states:
            query += f" AND state IN ({', '.join('?' for _ in states)})"
            args += states
        query += " ORDER BY seq LIMIT ?"
        args.append(limit)
        with self._lock:
            return [self._row(r) for r in self._db.execute(query, args).fetchall()]

    def update(self, job_id: str, **fields: Any) -> None:
        if not fields:
            return
        encoded = {k: json.dumps(v) if k == "progress" else v for k, v in fields.items()}
        sets = ", ".join(f"{k} = ?" for k in encoded)
        with self._lock:
            self._db.execute(
                f"UPDATE jobs SET {sets} WHERE job_id = ?", [*encoded.values(), job_id]
            )

    # -- sweeps ---------------------------------------------------------------------------------
    def _sweep(self, row: tuple) -> SweepRecord:
        _, sweep_id, request_id, spec, output, cells, created, digest, report = row
        return SweepRecord(sweep_id, request_id, json.loads(spec), output, json.loads(cells),
                           created, digest, json.loads(report) if report else {})  # fmt: skip

    def sweep_by_request(self, request_id: str) -> SweepRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM sweeps WHERE request_id = ?", (request_id,)).fetchone()  # fmt: skip
        return self._sweep(row) if row else None

    def add_sweep(self, record: SweepRecord) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO sweeps (sweep_id, request_id, spec, output, cells, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (record.sweep_id, record.request_id, json.dumps(record.spec, ensure_ascii=False),
                 record.output, json.dumps(record.cells, ensure_ascii=False), record.created_at),
            )  # fmt: skip

    def get_sweep(self, sweep_id: str) -> SweepRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM sweeps WHERE sweep_id = ?", (sweep_id,)).fetchone()  # fmt: skip
        return self._sweep(row) if row else None

    def finish_sweep(self, sweep_id: str, digest: str, report: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("UPDATE sweeps SET digest = ?, report = ? WHERE sweep_id = ?",
                             (digest, json.dumps(report, ensure_ascii=False), sweep_id))  # fmt: skip

    def next_queued(self) -> JobRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT * FROM jobs WHERE state = 'QUEUED' ORDER BY seq LIMIT 1"
            ).fetchone()
        return self._row(row) if row else None

    def requeue_interrupted(self) -> list[str]:
        """Jobs left RUNNING by a previous service process go back to the queue (they resume),
        but those whose cancel was asked for end CANCELLED: a cancel survives a restart."""
        with self._lock:
            ids = [
                r[0]
                for r in self._db.execute(
                    "SELECT job_id FROM jobs WHERE state = 'RUNNING' AND cancel_requested = 0"
                ).fetchall()
            ]
            self._db.execute(
                "UPDATE jobs SET state = 'CANCELLED', finished_at = ? "
                "WHERE state = 'RUNNING' AND cancel_requested != 0",
                (time.time(),),
            )
            self._db.execute("UPDATE jobs SET state = 'QUEUED' WHERE state = 'RUNNING'")
        return ids
