"""A run's scores as a whole: the score digest (DETERMINISM.md v2) and `scores.json`.

`scores.json` holds, for every score, its mean over examples with a 95% confidence
interval, and pass@k for the k its entry lists. Each example weighs the same: its n
samples are averaged first (they are not independent), then the interval is the normal
approximation over examples, mean +/- 1.96 x the standard error of the per-example means
(null below 2 examples). pass@k per example is Chen et al.'s unbiased estimator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rollout import determinism
from rollout.jobs.spec import JobSpec
from rollout.scoring.groups import pass_at_k

Z95 = 1.959963984540054
SCORES = "scores.json"


def score_column_names(names: Sequence[str]) -> list[str]:
    return [n for n in names if n.startswith("score_")]


def mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """Mean, 95% interval (normal approximation) and count of `values`."""
    n = len(values)
    if n == 0:
        return {"mean": None, "ci95": None, "n": 0}
    mean = math.fsum(values) / n
    if n < 2:
        return {"mean": mean, "ci95": None, "n": n}
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": n}


def summarize(spec: JobSpec, rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """scores.json from the rows' (example_id, score_<name>) values."""
    per_example: dict[str, dict[str, list[float | None]]] = {e.name: {} for e in spec.scoring}
    for row in rows:
        for e in spec.scoring:
            per_example[e.name].setdefault(row["example_id"], []).append(row[f"score_{e.name}"])
    metrics: dict[str, Any] = {}
    for e in spec.scoring:
        groups = per_example[e.name]
        means = [math.fsum(k) / len(k) for v in groups.values() if (k := [x for x in v if x is not None])]  # fmt: skip
        entry = mean_ci(means) | {
            "scorer": e.scorer,
            "rows": sum(len(v) for v in groups.values()),
            "null_rows": sum(x is None for v in groups.values() for x in v),
        }
        if e.pass_at_k:
            entry["pass_at_k"] = {
                str(k): mean_ci([
                    pass_at_k(len(v), sum(x is not None and x >= e.pass_threshold for x in v), k)
                    for v in groups.values()
                ])
                for k in e.pass_at_k
            }  # fmt: skip
        metrics[e.name] = entry
    return {
        "version": "rollout-scores-v1",
        "interval": "95% normal approximation over examples (per-example means)",
        "examples": len(next(iter(per_example.values()), {})),
        "metrics": metrics,
    }


def read_scores(files: Iterable[Path]) -> Iterable[dict[str, Any]]:
    """Every row's keys and score columns, file by file (files in row order)."""
    for path in files:
        pf = pq.ParquetFile(path)
        names = score_column_names(pf.schema_arrow.names)
        if not names:
            continue
        for batch in pf.iter_batches(columns=["row_index", "example_id", "sample_index", *names]):
            yield from batch.to_pylist()


def run_scores(spec: JobSpec, files: Sequence[Path]) -> tuple[str, dict[str, Any]]:
    """(score_digest, scores.json) of a run's shard files, in row order."""
    rows = list(read_scores(files))
    digest = determinism.score_digest(
        (r["row_index"], r["sample_index"],
         determinism.scores_json({k: v for k, v in r.items() if k.startswith("score_")}))
        for r in rows
    )  # fmt: skip
    summary = summarize(spec, rows)
    summary["score_digest"] = digest
    return digest, summary
