"""A finished run directory read as a stream of rows in (row_index, sample_index) order.

Rows come one Parquet record batch at a time, so a run of any size is read in bounded
memory. Each batch carries its rows' hashes recomputed from their contents (by the run's
determinism contract version, v1 or v2, in rollout.determinism): a row is judged by what
it holds, not by the hashes stored beside it, and a row whose stored hashes disagree with
its contents is flagged.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout import determinism
from rollout.data.columns import list_slices
from rollout.data.sink import logprobs_column_hashes, top_positions_hash
from rollout.errors import InputError
from rollout.runtime.manifest import JOB, Manifest

COLUMNS = ["row_index", "example_id", "sample_index", "seq_seed", "prompt_token_ids",
           "output_token_ids", "finish_reason", "prompt_hash", "output_hash", "row_hash"]  # fmt: skip
OPTIONAL = ["output_logprobs", "top_logprobs"]  # read where a run recorded them
BATCH_ROWS = 4096


class RunDir:
    """A finished run: its manifest, the job spec it ran (job.json) and its shard files."""

    def __init__(self, path: str | Path, label: str | None = None) -> None:
        self.path = Path(path).expanduser().resolve()
        self.label = label or str(path)
        if not self.path.is_dir():
            raise InputError(f"run {self.label!r}", f"{self.path} is not a directory")
        manifest = Manifest.load(self.path)
        if manifest is None:
            raise InputError(f"run {self.label!r}", f"{self.path} holds no manifest.json")
        if manifest.status != "complete" or not (self.path / "data").is_dir():
            raise InputError(
                f"run {self.label!r}",
                f"is not finished ({manifest.done}/{len(manifest.shards)} shards complete); "
                "run the same job again to finish it, then audit",
            )
        self.manifest = manifest

    @property
    def config_hash(self) -> str:
        return self.manifest.config_hash

    def job_spec(self) -> dict[str, Any]:
        path = self.path / JOB
        if not path.exists():
            raise InputError(
                f"run {self.label!r}", f"has no {JOB} (it was written by an older rollout)"
            )
        return json.loads(path.read_text(encoding="utf-8"))

    def has_logprobs(self) -> bool:
        return bool(self.manifest.config.get("sampling", {}).get("logprobs"))

    @property
    def determinism(self) -> str:
        return self.manifest.determinism

    def shard_files(self) -> Iterator[tuple[int, Path]]:
        for entry in self.manifest.shards:  # shards are row ranges in order
            path = self.path / "data" / entry.file
            if not path.exists():
                raise InputError(f"run {self.label!r}", f"shard file data/{entry.file} is missing")
            yield entry.shard_id, path

    def rows(
        self, keep: Callable[[pa.RecordBatch], np.ndarray] | None = None
    ) -> Iterator[tuple[tuple[int, int], Rows, int]]:
        """(key, batch, i) for every row in order; `keep` (a boolean mask per batch) filters."""
        files = (path for _, path in self.shard_files())
        return iter_rows(files, self.determinism, f"run {self.label!r}", keep)


def iter_rows(
    files: Iterable[Path],
    version: str,
    where: str,
    keep: Callable[[pa.RecordBatch], np.ndarray] | None = None,
) -> Iterator[tuple[tuple[int, int], Rows, int]]:
    """(key, batch, i) for every row of `files` (shard files of a run of determinism
    contract `version`, in row order)."""
    for path in files:
        try:
            batches = list_batches(path)
            for batch in batches:
                if keep is not None:
                    batch = batch.filter(pa.array(keep(batch)))
                if not batch.num_rows:
                    continue
                rows = Rows(batch, version)
                for i, key in enumerate(zip(rows.row_index, rows.sample_index, strict=True)):
                    yield key, rows, i
        except (OSError, pa.ArrowException) as exc:
            raise InputError(where, f"{path.name} cannot be read: {exc}") from None


def verify_shard_file(path: Path, version: str) -> tuple[str, int]:
    """Recompute every row's hashes from its contents (contract `version`), a record batch
    at a time; return (shard_digest, rows). Raises ValueError naming the first row out of
    order or not matching its stored hashes: a file changed after it was written is never
    trusted."""
    hashes: list[str] = []
    last: tuple[int, int] | None = None
    for batch in list_batches(path):
        rows = Rows(batch, version)
        for i, key in enumerate(zip(rows.row_index, rows.sample_index, strict=True)):
            if last is not None and key <= last:
                raise ValueError(f"{path.name}: rows out of order at row_index {key[0]}")
            if not rows.consistent[i]:
                raise ValueError(
                    f"{path.name}: row_index {key[0]} sample {key[1]} does not match its hashes"
                )
            last = key
        hashes += rows.row_hash
    return determinism.shard_digest(hashes), len(hashes)


def list_batches(path: Path, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The file's record batches: `columns`, or the ones a row's hashes are computed from."""
    file = pq.ParquetFile(path)
    if columns is None:
        present = set(file.schema_arrow.names)
        columns = COLUMNS + [c for c in OPTIONAL if c in present]
    return file.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False)


class Rows:
    """One record batch's rows as Python and NumPy values, with hashes from their contents."""

    row_index: list[int]
    sample_index: list[int]
    example_id: list[str]
    seq_seed: list[int]
    finish_reason: list[str]
    stored_row_hash: list[str]
    prompt_hash: list[str]  # recomputed
    row_hash: list[str]  # recomputed
    consistent: list[bool]  # stored hashes == recomputed
    _prompt: tuple[np.ndarray, np.ndarray]
    _output: tuple[np.ndarray, np.ndarray]
    _logprobs: tuple[np.ndarray, np.ndarray] | None
    top_hash: list[str]  # recomputed v2 top_logprobs_hash ("" when none recorded)

    def __init__(self, batch: pa.RecordBatch, version: str) -> None:
        col = batch.column
        self.row_index = col("row_index").to_pylist()
        self.sample_index = col("sample_index").to_pylist()
        self.example_id = col("example_id").to_pylist()
        self.seq_seed = col("seq_seed").to_pylist()
        self.finish_reason = col("finish_reason").to_pylist()
        self.stored_row_hash = col("row_hash").to_pylist()
        stored_ph = col("prompt_hash").to_pylist()
        stored_oh = col("output_hash").to_pylist()
        self._prompt = list_slices(col("prompt_token_ids"))
        self._output = list_slices(col("output_token_ids"))
        names = batch.schema.names
        self._logprobs = list_slices(col("output_logprobs")) if "output_logprobs" in names else None
        self.prompt_hash, self.row_hash, self.consistent = [], [], []
        prompt_hashes = determinism.token_hashes(*self._prompt)
        output_hashes = determinism.token_hashes(*self._output)
        n = batch.num_rows
        lp_hashes = self.top_hash = [""] * n
        if "output_logprobs" in names:
            lp_hashes = logprobs_column_hashes(col("output_logprobs"))
        if "top_logprobs" in names:
            self.top_hash = [
                top_positions_hash(None if top is None else [[(e["token_id"], e["logprob"]) for e in pos] for pos in top])
                for top in col("top_logprobs").to_pylist()
            ]  # fmt: skip
        determinism.check_version(version)
        for i in range(n):
            ph, oh = prompt_hashes[i], output_hashes[i]
            finish = self.finish_reason[i]
            key = (self.example_id[i], self.sample_index[i], self.seq_seed[i], ph, oh, finish)
            try:
                rh = determinism.versioned_row_hash(version, key, lp_hashes[i], self.top_hash[i])
            except ValueError:  # a finish_reason outside the contract: never consistent
                rh = f"invalid finish_reason {finish!r}"
            self.prompt_hash.append(ph)
            self.row_hash.append(rh)
            self.consistent.append(
                (ph, oh, rh) == (stored_ph[i], stored_oh[i], self.stored_row_hash[i])
            )

    def prompt(self, i: int) -> np.ndarray:
        offsets, values = self._prompt
        return values[offsets[i] : offsets[i + 1]]

    def output(self, i: int) -> np.ndarray:
        offsets, values = self._output
        return values[offsets[i] : offsets[i + 1]]

    def logprobs(self, i: int) -> np.ndarray | None:
        if self._logprobs is None:
            return None
        offsets, values = self._logprobs
        if offsets[i + 1] == offsets[i] and len(self.output(i)):
            return None  # not recorded for this row
        return values[offsets[i] : offsets[i + 1]]
