"""Helpers for job tests: an independent implementation of the run digest."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pyarrow.dataset as pads


def independent_run_digest(run_dir: Path) -> tuple[str, list[dict]]:
    """DETERMINISM.md (v1 or v2, as the manifest says) recomputed from the Parquet files with
    struct + hashlib only."""
    version = json.loads((run_dir / "manifest.json").read_text()).get("determinism", "v1")
    rows = pads.dataset(run_dir / "data", format="parquet").to_table().to_pylist()
    rows.sort(key=lambda r: (r["row_index"], r["sample_index"]))
    h = hashlib.sha256(f"rollout-run-{version}\n".encode())

    def sha(fmt: str, values) -> str:
        return hashlib.sha256(b"".join(struct.pack(fmt, v) for v in values)).hexdigest()

    for r in rows:
        ph = sha("<i", r["prompt_token_ids"])
        oh = sha("<i", r["output_token_ids"])
        text = (f"rollout-row-{version}\n{r['example_id']}\n{r['sample_index']}\n{r['seq_seed']}\n"
                f"{ph}\n{oh}\n{r['finish_reason']}")  # fmt: skip
        if version == "v2":
            lps = r.get("output_logprobs")
            top = r.get("top_logprobs")
            lh = "" if lps is None else sha("<f", lps)
            th = ""
            if top is not None:
                th = hashlib.sha256(b"".join(
                    b"".join(struct.pack("<i", e["token_id"]) for e in pos)
                    + b"".join(struct.pack("<f", e["logprob"]) for e in pos)
                    for pos in top
                )).hexdigest()  # fmt: skip
            text += f"\n{lh}\n{th}"
        rh = hashlib.sha256(text.encode("utf-8")).hexdigest()
        assert (ph, oh, rh) == (r["prompt_hash"], r["output_hash"], r["row_hash"])
        h.update((rh + "\n").encode("ascii"))
    return h.hexdigest(), rows
