"""`rollout audit | verify | repeat`: determinism audits from the command line.

Exit codes: 0 IDENTICAL, 1 DIVERGED, 3 INCOMPARABLE (configs differ); 2 is a bad argument.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from rollout.cli.jobs import add_client_options, client_from_args


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="compare two finished runs row by row",
        description="Compare two finished runs: their configs, then every (row_index, "
        "sample_index). Exit 0 IDENTICAL, 1 DIVERGED, 3 INCOMPARABLE.",
    )
    p.add_argument("a", help="run directory (or, with --server, a job id)")
    p.add_argument("b", help="run directory (or, with --server, a job id)")
    _report_options(p)
    p.set_defaults(run=audit)

    p = sub.add_parser(
        "verify",
        help="regenerate a random sample of a finished run and compare it with the stored rows",
        description="Regenerate a deterministic random sample of a run's rows with the engine "
        "named in its manifest and compare them with the stored rows. Default sample: 1%% of "
        "the rows, at least 10.",
    )
    p.add_argument("target", metavar="RUN", help="run directory (or, with --server, a job id)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--sample", type=float, help="fraction of the rows, in (0, 1]")
    which.add_argument("--rows", type=int, help="number of rows")
    p.add_argument("--seed", type=int, default=0, help="which rows are drawn (default 0)")
    p.add_argument(
        "--actors", type=int, help="engine actors (default: the job's, at most one per shard)"
    )
    p.add_argument("--scratch", help="folder for the regenerated rows (default: the system temp)")
    p.add_argument("--ray-address", help="join this Ray cluster; default: start one")
    _report_options(p)
    p.set_defaults(run=verify)

    p = sub.add_parser(
        "repeat",
        help="run one job K times on different topologies; count distinct outputs",
        description="Run the job K times, varying actors, shard size and batch size (none "
        "is part of config_hash), then count distinct run digests and distinct outputs per "
        "row. Exit 0 when there is one of each.",
    )
    p.add_argument("config", help="the job spec (YAML or JSON)")
    p.add_argument("--times", type=int, default=3, help="number of runs (default 3)")
    p.add_argument("--vary", default="actors,shard_size,batch_size",
                   help="what changes between runs (default: actors,shard_size,batch_size)")  # fmt: skip
    p.add_argument("--out", help="folder for the runs (default: <output>.repeat-<time>)")
    p.add_argument("--ray-address", help="join this Ray cluster; default: start one")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(run=repeat)


def _report_options(p: argparse.ArgumentParser) -> None:
    add_client_options(p, server_help="run the audit on this service (names are job ids or "
                       "run directories there); default: here, on local directories")  # fmt: skip
    p.add_argument("--report", help="also write a self-contained HTML report to this file")
    p.add_argument("--max-examples", type=int, default=50, help="divergent pairs reported in full")
    p.add_argument("--no-decode", action="store_true", help="do not decode tokens to text")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


class _PhaseBar:
    """One tqdm bar per phase (regenerate, compare) on stderr."""

    def __init__(self, enabled: bool) -> None:
        self.enabled, self.bar, self.phase = enabled, None, ""

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        if phase != self.phase:
            self.close()
            self.phase = phase
            self.bar = tqdm(total=total or None, desc=phase, unit="row", file=sys.stderr)
        assert self.bar is not None
        self.bar.total = max(total, done) or None
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _finish(report: Any, args: argparse.Namespace) -> int:
    from rollout.audit.render import render_text, write_html

    if args.report:
        write_html(report, args.report)
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False))
    else:
        print(render_text(report))
        if args.report:
            print(f"report: {args.report}")
    return report.exit_code


def audit(args: argparse.Namespace) -> int:
    bar = _PhaseBar(not args.quiet and not args.json)
    try:
        if args.server:
            with client_from_args(args) as client:
                report = client.audit(args.a, args.b, args.max_examples, progress=bar)
        else:
            from rollout.audit.audit import audit_runs
            from rollout.audit.runs import RunDir

            report = audit_runs(RunDir(args.a), RunDir(args.b), args.max_examples, bar,
                                decode=not args.no_decode)  # fmt: skip
    finally:
        bar.close()
    return _finish(report, args)


def verify(args: argparse.Namespace) -> int:
    from rollout.audit.verify import Sample

    bar = _PhaseBar(not args.quiet and not args.json)
    try:
        if args.server:
            with client_from_args(args) as client:
                report = client.verify(args.target, args.sample, args.rows, args.seed,
                                       args.max_examples, progress=bar)  # fmt: skip
        else:
            from rollout.audit.runs import RunDir
            from rollout.audit.verify import verify_run

            sample = Sample(fraction=args.sample, rows=args.rows, seed=args.seed)
            report = verify_run(RunDir(args.target), sample, args.actors, args.ray_address,
                                args.scratch, args.max_examples, bar, decode=not args.no_decode)  # fmt: skip
    finally:
        bar.close()
    return _finish(report, args)


def repeat(args: argparse.Namespace) -> int:
    from rollout.audit.repeat import parse_vary, repeat_job
    from rollout.cli.run import _ProgressBar
    from rollout.jobs.spec import load_job_spec

    spec = load_job_spec(args.config)
    vary = parse_vary(args.vary)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path(f"{spec.output}.repeat-{stamp}")
    bar = _ProgressBar(enabled=not args.quiet and not args.json)

    def announce(text: str) -> None:
        if not args.json:
            print(f"[rollout] {text}", file=sys.stderr, flush=True)

    try:
        report = repeat_job(spec, args.times, vary, out, args.ray_address, bar, announce)
    finally:
        bar.close()
    if args.json:
        print(json.dumps(report.to_dict()))
        return report.exit_code
    lines = [f"repeat: {len(report.runs)} runs, varying {', '.join(report.vary)}; "
             f"verdict {report.verdict}"]  # fmt: skip
    for r in report.runs:
        lines.append(f"  run {r.index}: actors={r.actors} shard_size={r.shard_size} "
                     f"batch_size={r.batch_size or 'default'}  run_digest {r.run_digest[:16]}  "
                     f"{r.seconds:.1f} s  {r.output}")  # fmt: skip
    hist = ", ".join(f"{k} output{'s' if k > 1 else ''}: {v} rows"
                     for k, v in report.outputs_per_row.items())  # fmt: skip
    lines += [
        f"distinct run digests: {report.distinct_run_digests}",
        f"distinct outputs per row: {hist} ({report.rows} rows)",
    ]
    print("\n".join(lines))
    return report.exit_code
