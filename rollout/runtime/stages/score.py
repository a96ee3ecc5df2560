"""score: every scorer of the job's `scoring:` over the shard's rows, and the group
columns over each example's n samples (all of an example's samples are in one shard)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from rollout.data.columns import list_slices
from rollout.errors import ConfigError, InputError, RolloutError
from rollout.jobs.spec import JobSpec
from rollout.runtime.stages.base import ShardWork, Stage, drop_samples, row_error
from rollout.scoring.base import Scorer, ScoreRow
from rollout.scoring.groups import group_stats
from rollout.scoring.registry import build


def build_scorers(spec: JobSpec) -> list[Scorer]:
    """The job's scorers, in `scoring:` order."""
    return [build(e.name, e.scorer, e.options) for e in spec.scoring]


def score_columns(spec: JobSpec, scorers: list[Scorer], rows: list[ScoreRow], where: str) -> dict[str, pa.Array]:  # fmt: skip
    """The score columns of `rows` (in order): score_<name>, its detail, its group columns."""
    columns: dict[str, pa.Array] = {}
    for entry, scorer in zip(spec.scoring, scorers, strict=True):
        try:
            scores = scorer.score(rows)
        except RolloutError:
            raise
        except Exception as exc:  # a scorer's own failure: the job's, named, never internal
            raise InputError(f"scoring.{entry.name}", f"scorer {entry.scorer!r} failed on {where}: {type(exc).__name__}: {exc}") from None  # fmt: skip
        values = [s.value for s in scores]
        bad = next((v for v in values if v is not None and not math.isfinite(v)), None)
        if bad is not None:
            raise ConfigError(f"scoring.{entry.name}", bad, f"scorer {entry.scorer!r} gave a score that is not a finite number on {where}")  # fmt: skip
        name = f"score_{entry.name}"
        columns[name] = pa.array(values, pa.float64())
        if scorer.has_detail:
            columns[f"{name}_detail"] = pa.array([s.detail for s in scores], pa.string())
        if entry.advantages:
            means: list[Any] = [None] * len(rows)
            stds: list[Any] = [None] * len(rows)
            advantages: list[Any] = [None] * len(rows)
            groups: dict[str, list[int]] = {}
            for i, row in enumerate(rows):
                groups.setdefault(row.example_id, []).append(i)
            for members in groups.values():
                mean, std, adv = group_stats([values[i] for i in members], entry.eps)
                for i, a in zip(members, adv, strict=True):
                    means[i], stds[i], advantages[i] = mean, std, a
            columns[f"{name}_group_mean"] = pa.array(means, pa.float64())
            columns[f"{name}_group_std"] = pa.array(stds, pa.float64())
            columns[f"{name}_advantage"] = pa.array(advantages, pa.float64())
    return columns


class Score(Stage):
    name = "score"
    needs = ("samples", "generated")

    def run(self, work: ShardWork) -> None:
        spec = work.spec
        if not spec.scoring:
            work.scores = {}
            return
        if work.scorers is None:
            work.scorers = build_scorers(spec)
        g, samples = work.generated, work.samples
        assert g is not None and samples is not None
        texts = g.output_text.to_pylist()
        counts = np.diff(list_slices(g.output_token_ids)[0]).tolist()
        rows = [
            ScoreRow(output=texts[i] or "", prompt=s.prompt_text or "", columns=s.row,
                     finish_reason=g.finish_reason[i], num_output_tokens=counts[i],
                     example_id=s.example_id, sample_index=s.sample_index)
            for i, s in enumerate(samples)
        ]  # fmt: skip
        try:
            work.scores = score_columns(spec, work.scorers, rows, f"shard {work.task.shard_id}")
            return
        except (InputError, ConfigError):
            pass  # a scorer failed: find the rows it fails on, one at a time
        failed: set[int] = set()
        for i, (row, s) in enumerate(zip(rows, samples, strict=True)):
            try:
                score_columns(spec, work.scorers, [row], f"example {s.example_id!r}")
            except (InputError, ConfigError) as exc:
                row_error(work, "score", f"input row {s.row_index} sample {s.sample_index}", s.row_index,
                          s.example_id, str(exc), s.sample_index)  # fmt: skip
                failed.add(i)
        drop_samples(work, failed)
        rows = [r for i, r in enumerate(rows) if i not in failed]
        work.scores = score_columns(spec, work.scorers, rows, f"shard {work.task.shard_id}")
