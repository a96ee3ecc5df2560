"""The determinism contract (shared/DETERMINISM.md): the one place for seeds and hashes.

Outside tools recompute these values from a run's files, so every formula here is part
of a public interface. v1 never changes; v2 (new runs) adds the logprobs and top
logprobs to the row hash and a run digest of its own. A run's manifest names its version
(`determinism`), and every reader computes by that version.
"""

from __future__ import annotations

import array
import hashlib
import itertools
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np

UINT64_MAX = 2**64 - 1
CONTRACT_VERSIONS: tuple[str, ...] = ("v1", "v2")
CURRENT_VERSION = "v2"  # what new runs write
FinishReason = Literal["stop", "length"]
FINISH_REASONS: tuple[str, ...] = ("stop", "length")


def seq_seed(job_seed: int, example_id: str, sample_index: int) -> int:
    """The uint64 seed of one sample: blake2b-64 of the job seed, example id and sample index."""
    if not 0 <= job_seed <= UINT64_MAX:
        raise ValueError(f"job_seed must be an unsigned 64-bit integer, got {job_seed!r}.")
    if sample_index < 0:
        raise ValueError(f"sample_index must be >= 0, got {sample_index!r}.")
    payload = b"rollout-seed-v1\0" + f"{job_seed}\0{example_id}\0{sample_index}".encode()
    return int.from_bytes(hashlib.blake2b(payload, digest_size=8).digest(), "little")


def int32_le_bytes(token_ids: Sequence[int] | np.ndarray) -> bytes:
    """Token ids as little-endian int32 bytes (what the token hashes are taken of)."""
    if _NATIVE_LE_INT32 and type(token_ids) is list:  # the common case, without numpy's overhead
        return array.array("i", token_ids).tobytes()
    return np.asarray(token_ids, dtype="<i4").tobytes()


def token_hash(token_ids: Sequence[int] | np.ndarray) -> str:
    """sha256 of token ids as little-endian int32: `prompt_hash` and `output_hash`."""
    return hashlib.sha256(int32_le_bytes(token_ids)).hexdigest()


def token_hashes(
    offsets: np.ndarray, values: np.ndarray, rows: Sequence[int] | None = None
) -> list[str]:
    """`token_hash` of every row of a flat column, or of the given `rows`: row i is
    values[offsets[i]:offsets[i + 1]] (an Arrow list array's buffers), hashed straight
    from the int32 bytes."""
    return _slice_hashes(offsets, values, "<i4", rows)


def _slice_hashes(
    offsets: np.ndarray, values: np.ndarray, dtype: str, rows: Sequence[int] | None = None
) -> list[str]:
    """sha256 of each row's slice of a flat 4-byte column, as `dtype` bytes."""
    data = memoryview(np.ascontiguousarray(values, dtype=dtype)).cast("B")
    bounds = (np.asarray(offsets, dtype=np.int64) * 4).tolist()
    sha256 = hashlib.sha256
    if rows is None:
        return [sha256(data[a:b]).hexdigest() for a, b in itertools.pairwise(bounds)]
    return [sha256(data[bounds[i] : bounds[i + 1]]).hexdigest() for i in rows]


# array("i") is the platform's C int: the same bytes as "<i4" where that is 4 little-endian bytes
_NATIVE_LE_INT32 = sys.byteorder == "little" and array.array("i").itemsize == 4


def _row_hash(version: str, fields: tuple, finish_reason: str) -> str:
    """sha256 of "rollout-row-<version>" and the fields, one per line (the text both versions hash)."""
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {finish_reason!r}.")
    text = "\n".join([f"rollout-row-{version}", *map(str, fields)])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def row_hash(
    example_id: str,
    sample_index: int,
    seed: int,
    prompt_hash: str,
    output_hash: str,
    finish_reason: str,
) -> str:
    """The hash that identifies one generated row (v1)."""
    fields = (example_id, sample_index, seed, prompt_hash, output_hash, finish_reason)
    return _row_hash("v1", fields, finish_reason)


def row_hash_v2(
    example_id: str,
    sample_index: int,
    seed: int,
    prompt_hash: str,
    output_hash: str,
    finish_reason: str,
    logprobs_hash: str,
    top_logprobs_hash: str,
) -> str:
    """v2: the v1 fields, then the logprobs and top logprobs hashes ("" when not recorded)."""
    fields = (example_id, sample_index, seed, prompt_hash, output_hash, finish_reason,
              logprobs_hash, top_logprobs_hash)  # fmt: skip
    return _row_hash("v2", fields, finish_reason)


def versioned_row_hash(
    version: str, key: tuple, logprobs_hash: str = "", top_logprobs_hash: str = ""
) -> str:
    """The row hash of contract `version`; `key` is (example_id, sample_index, seed,
    prompt_hash, output_hash, finish_reason). v1 leaves the logprobs hashes out."""
    if check_version(version) == "v1":
        return row_hash(*key)
    return row_hash_v2(*key, logprobs_hash, top_logprobs_hash)


def logprobs_hash(logprobs: Sequence[float] | np.ndarray | None) -> str:
    """v2: sha256 of the logprobs as little-endian float32; "" when none were recorded."""
    if logprobs is None:
        return ""
    return hashlib.sha256(np.asarray(logprobs, dtype="<f4").tobytes()).hexdigest()


def logprobs_hashes(
    offsets: np.ndarray, values: np.ndarray, valid: np.ndarray | None = None
) -> list[str]:
    """`logprobs_hash` of every row of a flat float32 list column (an Arrow list array's
    buffers); "" for rows where `valid` is False (no logprobs recorded)."""
    hashes = _slice_hashes(offsets, values, "<f4")
    if valid is not None:
        hashes = [h if ok else "" for h, ok in zip(hashes, valid.tolist(), strict=True)]
    return hashes


def top_logprobs_hash(positions: Iterable[tuple[Sequence[int], Sequence[float]]] | None) -> str:
    """v2: sha256 over the positions of (token ids as <i4, logprobs as <f4); "" when none."""
    if positions is None:
        return ""
    h = hashlib.sha256()
    for ids, lps in positions:
        h.update(np.asarray(ids, dtype="<i4").tobytes())
        h.update(np.asarray(lps, dtype="<f4").tobytes())
    return h.hexdigest()


def shard_digest(row_hashes_in_order: Iterable[str]) -> str:
    """Digest of one shard; rows must be sorted by (row_index, sample_index)."""
    h = hashlib.sha256()
    for rh in row_hashes_in_order:
        h.update(rh.encode("ascii") + b"\n")
    return h.hexdigest()


def run_digest(row_hashes_in_order: Iterable[str], version: str) -> str:
    """Digest of a whole run of contract `version`; rows sorted by (row_index, sample_index)."""
    check_version(version)
    h = hashlib.sha256(f"rollout-run-{version}\n".encode("ascii"))
    for rh in row_hashes_in_order:
        h.update(rh.encode("ascii") + b"\n")
    return h.hexdigest()


def scores_json(scores: dict[str, Any] | None) -> str:
    """A row's score columns (name -> value; null for none) as the contract encodes them."""
    return json.dumps(scores, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)  # fmt: skip


def score_digest(rows_in_order: Iterable[tuple[int, int, str]]) -> str:
    """Digest of a run's scores: (row_index, sample_index, scores_json) of every row, sorted
    by (row_index, sample_index) (DETERMINISM.md v2, scores)."""
    h = hashlib.sha256(b"rollout-scores-v2\n")
    for row_index, sample_index, sj in rows_in_order:
        h.update(f"{row_index}\t{sample_index}\t{sj}\n".encode())
    return h.hexdigest()


def check_version(version: str) -> str:
    if version not in CONTRACT_VERSIONS:
        raise ValueError(
            f"determinism version must be one of {CONTRACT_VERSIONS}, got {version!r}."
        )
    return version


def canonical_json(value: Any) -> bytes:
    """The canonical JSON encoding that `config_hash` is computed over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8"
    )


def config_hash(config: Any) -> str:
    """sha256 of the canonical JSON of everything that decides a run's output."""
    return hashlib.sha256(canonical_json(config)).hexdigest()
