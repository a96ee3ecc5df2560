"""Compare the score columns of two runs row by row (a merge join on (row_index,
sample_index)), as `rollout audit` does for the generations. Scores are outside the row
hash (they can be recomputed without the engine), so they are compared here on their own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rollout import determinism
from rollout.audit.report import AuditReport, ScoreDivergence
from rollout.audit.runs import RunDir
from rollout.scoring.summary import read_scores


def _scored(run: RunDir) -> Iterator[tuple[tuple[int, int], dict[str, Any]]]:
    for row in read_scores(path for _, path in run.shard_files()):
        key = (row.pop("row_index"), row.pop("sample_index"))
        yield key, row


def compare_scores(report: AuditReport, a: RunDir, b: RunDir, max_examples: int) -> None:
    """Count the rows in both runs whose score columns differ; keep the first few. A run
    with scores against one without is a note, not a difference."""
    da, db = a.manifest.score_digest, b.manifest.score_digest
    if not da and not db:
        return
    if not da or not db:
        which = "A" if da else "B"
        report.notes.append(f"only run {which} has scores: they are not compared")
        return
    if da == db:
        return
    ia, ib = _scored(a), _scored(b)
    ka, ra = next(ia, (None, None))
    kb, rb = next(ib, (None, None))
    while ka is not None and kb is not None:
        if ka < kb:
            ka, ra = next(ia, (None, None))
        elif kb < ka:
            kb, rb = next(ib, (None, None))
        else:
            assert ra is not None and rb is not None
            sa = {k: v for k, v in ra.items() if k != "example_id"}
            sb = {k: v for k, v in rb.items() if k != "example_id"}
            if determinism.scores_json(sa) != determinism.scores_json(sb):
                report.score_differing += 1
                if len(report.score_divergences) < max_examples:
                    column = next(c for c in sorted(set(sa) | set(sb)) if sa.get(c, "absent") != sb.get(c, "absent"))  # fmt: skip
                    report.score_divergences.append(ScoreDivergence(
                        ka[0], ka[1], str(ra["example_id"]), column,
                        determinism.scores_json(sa.get(column)), determinism.scores_json(sb.get(column)),
                    ))  # fmt: skip
            ka, ra = next(ia, (None, None))
            kb, rb = next(ib, (None, None))
