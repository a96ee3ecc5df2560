"""`rollout score RUN --scoring S.yaml --output DIR`: score a finished run again, or with
new scorers, into a new run directory; nothing is regenerated."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "score",
        help="compute new or changed score columns for a finished run (nothing regenerated)",
        description=__doc__,
    )
    p.add_argument("run_dir", metavar="RUN", help="a finished run directory")
    p.add_argument("--scoring", required=True, help="a YAML file: a list of scoring entries (or scoring: [...])")  # fmt: skip
    p.add_argument("--output", required=True, help="the new run's directory (new or empty)")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from rollout.cli.run import scores_line
    from rollout.scoring.rescore import load_scoring, rescore

    scoring = load_scoring(args.scoring)
    bar = tqdm(total=0, unit="shard", desc="score", file=sys.stderr, disable=None)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    manifest = rescore(args.run_dir, scoring, args.output, progress)
    bar.close()
    out = Path(args.output).expanduser().resolve()
    print(f"scored:       {manifest.rows} rows of {args.run_dir} (nothing regenerated)\n"
          f"output:       {out}/data\n"
          f"run_digest:   {manifest.run_digest} (the generation run's)\n"
          f"config:       {manifest.config_hash}\n"
          f"{scores_line(out)}\n"
          f"score_digest: {manifest.score_digest}")  # fmt: skip
    return 0
