"""Output rows: the Arrow schema of a generation, and atomic Parquet shard files."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rollout import determinism
from rollout.data.columns import list_slices
from rollout.engines.base import GenerationBatch

# Rows per Parquet row group: a reader (resume checks, audits, verify) holds one group of
# one column at a time, so memory is bounded by this, not by the shard size.
ROW_GROUP_ROWS = 4096
# Columns whose values rarely repeat: a dictionary page for them is work thrown away.
_NO_DICTIONARY = frozenset(
    ["seq_seed", "prompt_hash", "output_hash", "row_hash", "output_token_ids", "output_text",
     "output_logprobs", "top_logprobs"]
)  # fmt: skip


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
class ShardRows:
    """One shard's rows in (row_index, sample_index) order: their keys and prompt text, the
    engine's columns for them, and the input columns carried over (input_<name>: values)."""

    row_index: list[int]
    example_id: list[str]
    sample_index: list[int]
    seq_seed: list[int]
    prompt: list[str | None]
    generated: GenerationBatch
    carried: dict[str, pa.Array | pa.ChunkedArray] = field(default_factory=dict)


def shard_table(schema: pa.Schema, version: str, rows: ShardRows) -> tuple[pa.Table, list[str]]:
    """The shard's output table and its rows' row_hash values (determinism contract
    `version`). Output and logprobs hashes are taken straight from the Arrow buffers; the n
    samples of a row share one prompt hash."""
    g = rows.generated
    offsets, values = list_slices(g.output_token_ids)
    output_hashes = determinism.token_hashes(offsets, values)
    prompt_ids = pa.array(g.prompt_token_ids, pa.list_(pa.int32()))
    firsts, last_row = [], -1  # the first sample of each row: the n samples share its prompt
    for i, row_index in enumerate(rows.row_index):
        if row_index != last_row:
            firsts.append(i)
            last_row = row_index
    first_hashes = determinism.token_hashes(*list_slices(prompt_ids), rows=firsts)
    repeats = np.diff(firsts + [len(rows.row_index)]).tolist()
    prompt_hashes = [ph for ph, k in zip(first_hashes, repeats, strict=True) for _ in range(k)]
    n = len(rows.row_index)
    keys = zip(rows.example_id, rows.sample_index, rows.seq_seed, prompt_hashes, output_hashes,
               g.finish_reason, strict=True)  # fmt: skip
    lp_hashes = top_hashes = [""] * n
    if determinism.check_version(version) != "v1":
        if "output_logprobs" in schema.names and g.output_logprobs is not None:
            lp_hashes = logprobs_column_hashes(g.output_logprobs)
        if "top_logprobs" in schema.names and g.top_logprobs is not None:
            top_hashes = [top_positions_hash(top) for top in g.top_logprobs]
    row_hashes = [
        determinism.versioned_row_hash(version, key, lp, top)
        for key, lp, top in zip(keys, lp_hashes, top_hashes, strict=True)
    ]
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        "row_index": pa.array(rows.row_index, pa.int64()),
        "example_id": pa.array(rows.example_id, pa.string()),
        "sample_index": pa.array(rows.sample_index, pa.int32()),
        "seq_seed": pa.array(rows.seq_seed, pa.uint64()),
        "prompt": pa.array(rows.prompt, pa.string()),
        "prompt_token_ids": prompt_ids,
        "output_text": g.output_text,
        "output_token_ids": g.output_token_ids,
        "finish_reason": pa.array(g.finish_reason, pa.string()),
        "num_prompt_tokens": pa.array([len(p) for p in g.prompt_token_ids], pa.int32()),
        "num_output_tokens": pa.array(np.diff(offsets).astype(np.int32)),
        "prompt_hash": pa.array(prompt_hashes, pa.string()),
        "output_hash": pa.array(output_hashes, pa.string()),
        "row_hash": pa.array(row_hashes, pa.string()),
        **rows.carried,
    }
    if "output_logprobs" in schema.names:
        lps = g.output_logprobs
        columns["output_logprobs"] = pa.nulls(n, pa.list_(pa.float32())) if lps is None else lps
    if "top_logprobs" in schema.names:
        columns["top_logprobs"] = pa.array(
            [None if top is None else [[{"token_id": t, "logprob": lp} for t, lp in pos]
                                       for pos in top]
             for top in (g.top_logprobs or [None] * n)],
            schema.field("top_logprobs").type,
        )  # fmt: skip
    return pa.Table.from_arrays([columns[name] for name in schema.names], schema=schema), row_hashes


def logprobs_column_hashes(column: pa.ListArray | pa.ChunkedArray) -> list[str]:
    """`determinism.logprobs_hash` of each row of a list<float32> column ("" for null rows)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return determinism.logprobs_hashes(*list_slices(column), valid=valid)


def top_positions_hash(top: list[list[tuple[int, float]]] | None) -> str:
    """`determinism.top_logprobs_hash` of one row's top logprobs as engines give them."""
    if top is None:
        return ""
    return determinism.top_logprobs_hash(
        ([t for t, _ in pos], [lp for _, lp in pos]) for pos in top
    )


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
        pq.write_table(
            table,
            tmp,
            compression="zstd",
            row_group_size=ROW_GROUP_ROWS,
            use_dictionary=[n for n in table.schema.names if n not in _NO_DICTIONARY],
            write_page_checksum=True,  # a reader verifying pages catches any flipped byte
        )
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
