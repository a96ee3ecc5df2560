"""Helpers for job tests: an independent implementation of the run digest."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pyarrow.dataset as pads


def independent_run_digest(run_dir: Path) -> tuple[str, list[dict]]:
    """DETERMINISM.md v1 recomputed from the Parquet files with struct + hashlib only."""
    rows = pads.dataset(run_dir / "data", format="parquet").to_table().to_pylist()
    rows.sort(key=lambda r: (r["row_index"], r["sample_index"]))
    h = hashlib.sha256(b"rollout-run-v1\n")
    for r in rows:
        ph = hashlib.sha256(
            b"".join(struct.pack("<i", t) for t in r["prompt_token_ids"])
        ).hexdigest()
        oh = hashlib.sha256(
            b"".join(struct.pack("<i", t) for t in r["output_token_ids"])
        ).hexdigest()
        text = (f"rollout-row-v1\n{r['example_id']}\n{r['sample_index']}\n{r['seq_seed']}\n"
                f"{ph}\n{oh}\n{r['finish_reason']}")  # fmt: skip
        rh = hashlib.sha256(text.encode("utf-8")).hexdigest()
        assert (ph, oh, rh) == (r["prompt_hash"], r["output_hash"], r["row_hash"])
        h.update((rh + "\n").encode("ascii"))
    return h.hexdigest(), rows
