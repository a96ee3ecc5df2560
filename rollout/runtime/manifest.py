"""The run's manifest (`manifest.json`): config_hash, engine fingerprint, shards and run_digest.

Rewritten atomically (temporary file, fsync, rename) each time shards complete, so a
reader or a resumed run always finds a whole manifest. Timings and counters live in
`stats.json`, apart from the digests: they differ from run to run.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollout.data.sink import fsync_dir

MANIFEST = "manifest.json"
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

    @classmethod
    def load(cls, out_dir: Path) -> Manifest | None:
        path = out_dir / MANIFEST
        if not path.exists():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        data["shards"] = [ShardEntry(**s) for s in data["shards"]]
        return cls(**data)

    def save(self, out_dir: Path) -> None:
        write_json_atomic(out_dir / MANIFEST, asdict(self))

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
