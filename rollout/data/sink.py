"""Output rows: the Arrow schema of a generation, and atomic Parquet shard files."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rollout import determinism

# Rows per Parquet row group: a reader (resume checks, audits, verify) holds one group of
# one column at a time, so memory is bounded by this, not by the shard size.
ROW_GROUP_ROWS = 4096


def output_schema(logprobs: bool, top_logprobs: bool, carried: Sequence[pa.Field]) -> pa.Schema:
    """The columns every output row carries (DETERMINISM.md types), then the carried inputs."""
    fields = [
        pa.field("row_index", pa.int64(), nullable=False),
        pa.field("example_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("seq_seed", pa.uint64(), nullable=False),
        pa.field("prompt", pa.string()),
        pa.field("prompt_token_ids", pa.list_(pa.int32())),
        pa.field("output_text", pa.string()),
        pa.field("output_token_ids", pa.list_(pa.int32())),
    ]
    if logprobs:
        fields.append(pa.field("output_logprobs", pa.list_(pa.float32())))
    if top_logprobs:
        entry = pa.struct([("token_id", pa.int32()), ("logprob", pa.float32())])
        fields.append(pa.field("top_logprobs", pa.list_(pa.list_(entry))))
    fields += [
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("num_prompt_tokens", pa.int32()),
        pa.field("num_output_tokens", pa.int32()),
        pa.field("prompt_hash", pa.string(), nullable=False),
        pa.field("output_hash", pa.string(), nullable=False),
        pa.field("row_hash", pa.string(), nullable=False),
    ]
    return pa.schema(fields + [pa.field(f"input_{f.name}", f.type) for f in carried])


@dataclass
class RowBuffer:
    """Column lists for one shard's rows, filled in (row_index, sample_index) order."""

    schema: pa.Schema
    columns: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.columns = {name: [] for name in self.schema.names}
        self._logprobs = "output_logprobs" in self.columns
        self._top = "top_logprobs" in self.columns

    def add(
        self,
        *,
        row_index: int,
        example_id: str,
        sample_index: int,
        seq_seed: int,
        prompt: str | None,
        prompt_token_ids: list[int],
        output_text: str | None,
        output_token_ids: list[int],
        finish_reason: str,
        output_logprobs: list[float] | None = None,
        top_logprobs: list | None = None,
        prompt_hash: str | None = None,
        carried: dict[str, Any] | None = None,
    ) -> str:
        """Append one row; computes and returns its row_hash. A `prompt_hash` given is the
        one of `prompt_token_ids` already computed (the n samples of a row share it);
        `carried` holds the input columns carried over (input_<name>: value)."""
        ph = prompt_hash or determinism.token_hash(prompt_token_ids)
        oh = determinism.token_hash(output_token_ids)
        rh = determinism.row_hash(example_id, sample_index, seq_seed, ph, oh, finish_reason)
        c = self.columns
        c["row_index"].append(row_index)
        c["example_id"].append(example_id)
        c["sample_index"].append(sample_index)
        c["seq_seed"].append(seq_seed)
        c["prompt"].append(prompt)
        c["prompt_token_ids"].append(prompt_token_ids)
        c["output_text"].append(output_text)
        c["output_token_ids"].append(output_token_ids)
        if self._logprobs:
            c["output_logprobs"].append(output_logprobs)
        if self._top:
            c["top_logprobs"].append(top_logprobs)
        c["finish_reason"].append(finish_reason)
        c["num_prompt_tokens"].append(len(prompt_token_ids))
        c["num_output_tokens"].append(len(output_token_ids))
        c["prompt_hash"].append(ph)
        c["output_hash"].append(oh)
        c["row_hash"].append(rh)
        for name, value in (carried or {}).items():
            c[name].append(value)
        return rh

    def table(self) -> pa.Table:
        return pa.table(self.columns, schema=self.schema)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(table: pa.Table, path: Path) -> None:
    """Write a Parquet file under a hidden temporary name, fsync it, then rename it into place.
    The temporary name is unique per writer: two copies of a shard (a straggler's backup)
    may write the same file at once, and each renames whole bytes into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP_ROWS)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    except BaseException:  # a full disk: give back what the partial file took
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    from rollout.runtime import faults

    faults.point("during_write")
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def verify_shard_file(path: Path) -> tuple[str, int]:
    """Recompute every row's hashes from its contents; return (shard_digest, rows).

    Raises ValueError naming the first row whose stored hashes do not match its
    contents: a file changed after it was written is never trusted.
    """
    columns = ["row_index", "example_id", "sample_index", "seq_seed", "prompt_token_ids",
               "output_token_ids", "finish_reason", "prompt_hash", "output_hash", "row_hash"]  # fmt: skip
    table = pq.read_table(path, columns=columns)
    hashes: list[str] = []
    last: tuple[int, int] | None = None
    for row in table.to_pylist():
        key = (row["row_index"], row["sample_index"])
        if last is not None and key <= last:
            raise ValueError(f"{path.name}: rows out of order at row_index {key[0]}")
        last = key
        ph = determinism.token_hash(row["prompt_token_ids"])
        oh = determinism.token_hash(row["output_token_ids"])
        rh = determinism.row_hash(
            row["example_id"], row["sample_index"], row["seq_seed"], ph, oh, row["finish_reason"]
        )
        if (ph, oh, rh) != (row["prompt_hash"], row["output_hash"], row["row_hash"]):
            raise ValueError(
                f"{path.name}: row_index {key[0]} sample {key[1]} does not match its hashes"
            )
        hashes.append(rh)
    return determinism.shard_digest(hashes), len(hashes)
