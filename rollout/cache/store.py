"""A content-addressed cache of generated rows: a directory of Parquet segments and an
SQLite index.

Determinism makes a row a pure function of what decides it, so a row generated once need
never be generated again. Its key (`row_key`) is the sha256 of everything that decides
it: the engine fingerprint, the prompt token ids, the sampling parameters, the seq_seed,
the completion when teacher-forced, and the determinism contract version. A hit returns
the engine's outputs for that row (tokens, text, finish reason, logprobs), which the shard
then hashes and writes like any other row.

Layout of DIR:
  index.sqlite          key -> (segment, row); WAL mode, one transaction per shard
  segments/<id>.parquet the rows, written whole (temporary name, fsync, rename) before
                        the index names them
  VERSION               the layout's version

Writers (engine actors, on one machine or on a shared filesystem with working locks) each
write their own segments; the index's transactions serialise them. A segment the index
does not name (a writer killed between the two steps) is only garbage (`rollout cache gc`).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rollout import determinism
from rollout.engines.base import GenerationRequest, GenerationResult
from rollout.errors import ConfigError

CACHE_VERSION = "rollout-cache-v1"
_ENTRY = pa.struct([("token_id", pa.int32()), ("logprob", pa.float32())])
SCHEMA = pa.schema([
    ("key", pa.string()),
    ("prompt_token_ids", pa.list_(pa.int32())),
    ("output_token_ids", pa.list_(pa.int32())),
    ("output_text", pa.string()),
    ("finish_reason", pa.string()),
    ("output_logprobs", pa.list_(pa.float32())),
    ("top_logprobs", pa.list_(pa.list_(_ENTRY))),
])  # fmt: skip


def engine_key(fingerprint: dict[str, Any]) -> str:
    """The part of every row key that names the engine: its whole fingerprint."""
    return hashlib.sha256(determinism.canonical_json(fingerprint)).hexdigest()


def check_cacheable(fingerprint: dict[str, Any]) -> None:
    """Refuse a cache for an engine that says it is not batch-invariant: its rows depend on
    their batch, so a cached row could differ from the one a run would make."""
    if fingerprint.get("batch_invariant") is False:
        raise ConfigError("cache", fingerprint.get("engine"), "this engine runs without batch invariance (batch_invariant: false in its fingerprint), so its rows cannot be cached")  # fmt: skip


def row_key(engine: str, request: GenerationRequest, version: str) -> str:
    """The cache key of one request's row: everything that decides its output."""
    forced = request.forced_output
    return hashlib.sha256(determinism.canonical_json({
        "cache": CACHE_VERSION,
        "engine": engine,
        "prompt": determinism.token_hash(list(request.prompt_token_ids)),
        "prompt_len": len(request.prompt_token_ids),
        "sampling": request.params.config_view(),
        "seq_seed": str(request.seq_seed),
        "forced": None if forced is None else determinism.token_hash(list(forced)),
        "determinism": version,
    })).hexdigest()  # fmt: skip


class GenerationCache:
    """One cache directory, opened by one process (each actor opens its own)."""

    def __init__(self, path: str | Path, create: bool = True) -> None:
        self.path = Path(path).expanduser()
        version = self.path / "VERSION"
        if not self.path.exists() and not create:
            raise ConfigError("cache", str(self.path), "does not exist")
        (self.path / "segments").mkdir(parents=True, exist_ok=True)
        if version.exists():
            found = version.read_text().strip()
            if found != CACHE_VERSION:
                raise ConfigError("cache", str(self.path), f"holds a cache of layout {found!r}, not {CACHE_VERSION!r}")  # fmt: skip
        else:
            version.write_text(CACHE_VERSION + "\n")
        self._db = sqlite3.connect(self.path / "index.sqlite", timeout=60, isolation_level=None,
                                   check_same_thread=False)  # fmt: skip
        for attempt in range(100):  # actors opening one new cache at once: one sets it up
            try:
                if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY, segment TEXT NOT NULL,"
                    " row INTEGER NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL)"
                )
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or attempt == 99:
                    raise ConfigError("cache", str(self.path), f"its index cannot be opened: {exc}") from None  # fmt: skip
                time.sleep(0.05 + 0.01 * attempt)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.Lock()
        self._segments: OrderedDict[str, pa.Table] = OrderedDict()  # a few recently read

    def close(self) -> None:
        self._db.close()

    # -- reading ------------------------------------------------------------------------------
    def get(self, keys: Sequence[str], request_ids: Sequence[str]) -> dict[int, GenerationResult]:
        """The cached rows among `keys`, by position, as results with the given request ids."""
        found: dict[str, tuple[str, int]] = {}
        unique = list(dict.fromkeys(keys))
        with self._lock:
            for i in range(0, len(unique), 500):
                part = unique[i : i + 500]
                marks = ",".join("?" * len(part))
                for key, segment, row in self._db.execute(
                    f"SELECT key, segment, row FROM rows WHERE key IN ({marks})", part
                ):
                    found[key] = (segment, row)
            if found:
                self._db.execute(
                    f"UPDATE rows SET last_used = ? WHERE key IN ({','.join('?' * min(len(found), 500))})",
                    [time.time(), *list(found)[:500]],
                )  # fmt: skip
        out: dict[int, GenerationResult] = {}
        for i, key in enumerate(keys):
            if key not in found:
                continue
            segment, row = found[key]
            table = self._segment(segment)
            if table is None:  # removed by a gc since the lookup: a miss
                continue
            r = table.slice(row, 1).to_pylist()[0]
            if r["key"] != key:
                raise ConfigError("cache", str(self.path), f"segment {segment} row {row} holds another key: the cache is damaged (rollout cache gc)")  # fmt: skip
            top = r["top_logprobs"]
            out[i] = GenerationResult(
                request_id=request_ids[i], prompt_token_ids=r["prompt_token_ids"],
                output_token_ids=r["output_token_ids"], output_text=r["output_text"],
                finish_reason=r["finish_reason"], output_logprobs=r["output_logprobs"],
                top_logprobs=None if top is None else [[(e["token_id"], e["logprob"]) for e in pos] for pos in top],
            )  # fmt: skip
        return out

    def _segment(self, name: str) -> pa.Table | None:
        table = self._segments.get(name)
        if table is None:
            try:
                table = pq.read_table(self.path / "segments" / name)
            except FileNotFoundError:
                return None
            self._segments[name] = table
            while len(self._segments) > 8:
                self._segments.popitem(last=False)
        else:
            self._segments.move_to_end(name)
        return table

    # -- writing ------------------------------------------------------------------------------
    def put(self, keys: Sequence[str], results: Sequence[GenerationResult]) -> int:
        """Add rows not yet cached: one segment file, then one index transaction. The
        number of rows added."""
        from rollout.data.sink import write_atomic

        if not keys:
            return 0
        with self._lock:
            known = set()
            for i in range(0, len(keys), 500):
                part = list(keys[i : i + 500])
                known |= {k for (k,) in self._db.execute(f"SELECT key FROM rows WHERE key IN ({','.join('?' * len(part))})", part)}  # fmt: skip
        new = [(k, r) for k, r in dict(zip(keys, results, strict=True)).items() if k not in known]
        if not new:
            return 0
        table = pa.table({
            "key": [k for k, _ in new],
            "prompt_token_ids": [r.prompt_token_ids for _, r in new],
            "output_token_ids": [r.output_token_ids for _, r in new],
            "output_text": [r.output_text for _, r in new],
            "finish_reason": [r.finish_reason for _, r in new],
            "output_logprobs": [r.output_logprobs for _, r in new],
            "top_logprobs": [None if r.top_logprobs is None else [[{"token_id": t, "logprob": lp} for t, lp in pos] for pos in r.top_logprobs] for _, r in new],
        }, schema=SCHEMA)  # fmt: skip
        name = f"{time.strftime('%Y%m%d')}-{os.getpid()}-{uuid.uuid4().hex[:12]}.parquet"
        write_atomic(table, self.path / "segments" / name)
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT OR IGNORE INTO rows VALUES (?, ?, ?, ?, ?)",
                    [(k, name, i, now, now) for i, (k, _) in enumerate(new)],
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return len(new)

    # -- maintenance --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._lock:
            rows, segments = self._db.execute("SELECT COUNT(*), COUNT(DISTINCT segment) FROM rows").fetchone()  # fmt: skip
        files = list((self.path / "segments").glob("*.parquet"))
        return {
            "path": str(self.path), "version": CACHE_VERSION, "rows": rows,
            "segments": segments, "segment_files": len(files),
            "bytes": sum(f.stat().st_size for f in files),
        }  # fmt: skip

    def gc(self, max_bytes: int | None = None, older_than_s: float | None = None) -> dict[str, int]:
        """Remove segments the index does not name and index rows whose segment is gone;
        then, with limits, whole segments least recently used first until the cache is
        under `max_bytes` and no segment unused for `older_than_s` is left."""
        removed_files = removed_rows = 0
        with self._lock:
            named = {s for (s,) in self._db.execute("SELECT DISTINCT segment FROM rows")}
        files = {f.name: f for f in (self.path / "segments").glob("*.parquet")}
        for name, f in files.items():
            if name not in named and time.time() - f.stat().st_mtime > 60:  # not a write in flight
                f.unlink()
                removed_files += 1
        with self._lock:
            for name in named - set(files):
                removed_rows += self._db.execute("DELETE FROM rows WHERE segment = ?", (name,)).rowcount  # fmt: skip
            usage = list(self._db.execute("SELECT segment, MAX(last_used) FROM rows GROUP BY segment ORDER BY 2"))  # fmt: skip
        sizes = {n: f.stat().st_size for n, f in files.items() if n in named}
        total = sum(sizes.values())
        now = time.time()
        for name, last_used in usage:
            too_big = max_bytes is not None and total > max_bytes
            too_old = older_than_s is not None and now - last_used > older_than_s
            if not (too_big or too_old):
                continue
            with self._lock:
                removed_rows += self._db.execute("DELETE FROM rows WHERE segment = ?", (name,)).rowcount  # fmt: skip
            (self.path / "segments" / name).unlink(missing_ok=True)
            removed_files += 1
            total -= sizes.get(name, 0)
        self._segments.clear()
        return {"segments_removed": removed_files, "rows_removed": removed_rows}
