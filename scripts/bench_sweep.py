"""A sweep whose cells overlap, with the generation cache and without it, side by side in
one run (docs/BENCHMARKS.md): cells n = 4, the same cell again (another shard size: a
different cell, the same rows), and n = 8. Of its rows, only the n = 8 cell's are new (its
first four samples are the n = 4 cell's): the ratio of generated rows (cache / no cache)
must equal the fraction of rows that are new.

Prints Markdown; `--write FILE` replaces the sweep section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import publish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def run(cache: bool, problems: int, max_tokens: int, out: Path) -> tuple[float, int, int, int, str]:
    from rollout.sweeps.runner import SweepRunner
    from rollout.sweeps.spec import parse_sweep

    lines = (ROOT / "data/math/word_problems.jsonl").read_text().splitlines()[:problems]
    data = out.parent / "problems.jsonl"
    data.write_text("\n".join(lines) + "\n")
    base = {"input": {"path": str(data)}, "id_column": "id",
            "prompt": {"template": "{question}\nEnd with '#### <number>'.", "chat": True},
            "sampling": {"temperature": 0.8, "max_tokens": max_tokens}, "engine": {"name": "smollm2"},
            "shard_size": 6, "pool": {"actors": 2, "cpus_per_actor": 1}}  # fmt: skip
    spec = parse_sweep({"name": "overlap", "base": base, "cache": cache, "cells": [
        {"n": 4}, {"n": 4, "shard_size": 4}, {"n": 8}]})  # fmt: skip
    t0 = time.perf_counter()
    sweep = SweepRunner(spec, base, out).run()
    seconds = time.perf_counter() - t0
    tokens = 0
    import json

    for c in sweep.cells:
        stats = json.loads((out / "cells" / c.cell_id / "stats.json").read_text())
        tokens += stats["output_tokens_generated"] if not c.kept else 0
    rows = sum(c.rows for c in sweep.cells)
    return seconds, rows, sweep.rows_generated, tokens, sweep.digest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--problems", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--write", type=Path)
    args = ap.parse_args()
    import torch

    from rollout.runtime import cluster

    cluster.connect(None)
    tmp = Path(tempfile.mkdtemp(prefix="rollout-bench-sweep-"))
    try:
        off = run(False, args.problems, args.max_tokens, tmp / "off")
        on = run(True, args.problems, args.max_tokens, tmp / "on")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = off[1]
    new = args.problems * 8  # the n = 8 cell's rows; its first 4 samples are the n = 4 cell's
    lines = [
        "## Sweep: overlapping cells with and without the generation cache (`scripts/bench_sweep.py`)",
        "",
        f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__}; smollm2, {args.problems} word problems, temperature 0.8, max_tokens {args.max_tokens}; cells n = 4, the same cell again (another shard size), n = 8; measured in one run.",  # fmt: skip
        "",
        "| | wall time (s) | rows written | rows generated | output tokens generated | sweep digest |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
        f"| no cache | {off[0]:.1f} | {off[1]} | {off[2]} | {off[3]} | `{off[4][:16]}` |",
        f"| cache | {on[0]:.1f} | {on[1]} | {on[2]} | {on[3]} | `{on[4][:16]}` |",
        "",
        f"- **generated rows, cache / no cache: {on[2] / off[2]:.3f}; fraction of the rows that are new: {new / rows:.3f}** (they must be equal)",  # fmt: skip
        f"- wall time, cache / no cache: {on[0] / off[0]:.2f}; output tokens generated, cache / no cache: {on[3] / max(off[3], 1):.3f}",  # fmt: skip
        f"- the two sweeps' digests are {'equal' if on[4] == off[4] else 'DIFFERENT'}: the cache changes no row",  # fmt: skip
    ]
    publish("\n".join(lines), args.write)


if __name__ == "__main__":
    main()
