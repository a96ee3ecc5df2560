"""`rollout audit`: compare two finished runs row by row."""

from __future__ import annotations

import threading

from rollout.audit.compare import ProgressFn, compare_streams
from rollout.audit.report import AuditReport, RunInfo
from rollout.audit.runs import RunDir
from rollout.audit.scores import compare_scores
from rollout.errors import RolloutError
from rollout.jobs.config_diff import config_diff


def run_info(run: RunDir) -> RunInfo:
    m = run.manifest
    return RunInfo(
        label=run.label,
        path=str(run.path),
        config_hash=m.config_hash,
        run_digest=m.run_digest or "",
        rows=m.rows or 0,
        engine=str(m.engine.get("engine", "")),
        determinism=m.determinism,
        score_digest=m.score_digest or "",
    )


def audit_runs(
    a: RunDir,
    b: RunDir,
    max_examples: int = 50,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    decode: bool = True,
) -> AuditReport:
    """Compare run A with run B: their configs, then every (row_index, sample_index)."""
    report = AuditReport("audit", run_info(a), run_info(b))
    report.config_equal = a.config_hash == b.config_hash
    report.config_diff = config_diff(a.manifest.config, b.manifest.config)
    total = max(report.a.rows, report.b.rows)
    compare_scores(report, a, b, max_examples)
    compare_streams(report, a.rows(), b.rows(), max_examples, progress, total, cancel)
    if decode:
        attach_text(report, a.manifest.engine)
    return report


def attach_text(report: AuditReport, fingerprint: dict) -> None:
    """Decode the tokens around each listed divergence with the run's engine's tokenizer."""
    if not report.divergences:
        return
    from rollout.engines import engine_class

    try:
        decoder = engine_class(str(fingerprint.get("engine"))).token_decoder(fingerprint)
    except (RolloutError, ImportError, OSError):
        decoder = None
    if decoder is None:
        return
    for d in report.divergences:
        d.text_a = [decoder(t) for t in d.context_a]
        d.text_b = [decoder(t) for t in d.context_b]
