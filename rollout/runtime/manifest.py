"""The run's manifest (`manifest.json`): config_hash, engine fingerprint, shards and run_digest.

Completed shards are recorded in `shards.jsonl`, a journal appended (and fsynced) once
per batch of shards that finish together: O(1) per shard, however many shards a run
has. `manifest.json` is a snapshot, rewritten atomically (temporary file, fsync,
rename) every few seconds and at the end, after which the journal is emptied.
`Manifest.load` reads the snapshot and replays the journal, so a reader or a resumed
run always sees every recorded shard and never a partial file. Timings and counters
live in `stats.json`, apart from the digests: they differ from run to run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rollout.data.sink import fsync_dir

MANIFEST = "manifest.json"
JOURNAL = "shards.jsonl"
STATS = "stats.json"
JOB = "job.json"
VERSION = "rollout-manifest-v1"


@dataclass
class ShardEntry:
    shard_id: int
    start: int
    end: int
    file: str
    complete: bool = False
    rows: int | None = None
    shard_digest: str | None = None
    skipped: list[dict] = field(default_factory=list)
    file_sha256: str | None = None  # of the shard file's bytes: any flipped byte is caught

    def mark_complete(self, done: Any) -> None:
        """The shard was recorded as made by `done` (a ShardResult or a journal record)."""
        self.complete = True
        self.rows, self.shard_digest = done.rows, done.shard_digest
        self.skipped, self.file_sha256 = list(done.skipped), done.file_sha256 or None


@dataclass
class Manifest:
    config_hash: str
    config: dict[str, Any]
    engine: dict[str, Any]
    input_rows: int
    shard_size: int
    shards: list[ShardEntry]
    status: str = "running"  # running | complete
    run_digest: str | None = None
    rows: int | None = None
    version: str = VERSION
    # the determinism contract the run's hashes follow; manifests from before v2 lack it
    determinism: str = "v1"
    # digest of the rows' score columns (DETERMINISM.md v2, scores); None: the job scores nothing
    score_digest: str | None = None
    # `rollout score`: the generation run this run's rows come from (path, run_digest, config_hash)
    source_run: dict[str, Any] | None = None

    @classmethod
    def load(cls, out_dir: Path) -> Manifest | None:
        """The snapshot with the journal's shards applied; None where there is no run."""
        path = out_dir / MANIFEST
        if not path.exists():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        data["shards"] = [ShardEntry(**s) for s in data["shards"]]
        manifest = cls(**data)
        journal = out_dir / JOURNAL
        if journal.exists():
            by_id = {s.shard_id: s for s in manifest.shards}
            for line in journal.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a crash: not recorded
                    continue
                entry = by_id.get(record.get("shard_id"))
                if entry is not None:
                    entry.mark_complete(
                        SimpleNamespace(**{"skipped": [], "file_sha256": None, **record})
                    )
        return manifest

    def save(self, out_dir: Path) -> None:
        """Write the snapshot, then empty the journal it now includes."""
        write_json_atomic(out_dir / MANIFEST, asdict(self))
        journal = out_dir / JOURNAL
        if journal.exists():
            journal.unlink()

    @staticmethod
    def record(out_dir: Path, entries: Sequence[Any]) -> None:
        """Append completed shards (ShardResults or ShardEntries) to the journal: durable
        once this returns."""
        lines = "".join(
            json.dumps({"shard_id": e.shard_id, "rows": e.rows, "shard_digest": e.shard_digest,
                        "skipped": e.skipped, "file_sha256": e.file_sha256}, ensure_ascii=False) + "\n"
            for e in entries
        )  # fmt: skip
        with open(out_dir / JOURNAL, "a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())

    @property
    def done(self) -> int:
        return sum(s.complete for s in self.shards)


def write_json_atomic(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, ensure_ascii=False, indent=1) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write under a hidden temporary name, fsync, rename: readers see all of it or none."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
