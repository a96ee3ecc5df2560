"""`rollout sweep SWEEP.yaml --output DIR`: a grid of jobs from one spec, run here (or on a
service with --server), sharing a generation cache; one report (docs/sweeps.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run an eval sweep: a grid of jobs, one report", description=__doc__)  # fmt: skip
    p.add_argument("sweep", help="the sweep spec (YAML)")
    p.add_argument("--output", required=True, help="the sweep's directory (on the service: a path under its data roots)")  # fmt: skip
    p.add_argument("--baseline", help="the cell the report compares the others with (sweep: baseline)")  # fmt: skip
    p.add_argument("--server", help="run the cells on this rollout service (host:port) instead of here")  # fmt: skip
    p.add_argument("--detach", action="store_true", help="with --server: submit and return; run the same command again to follow it")  # fmt: skip
    p.add_argument("--cancel", action="store_true", help="with --server: cancel the sweep's cells that have not ended")  # fmt: skip
    p.add_argument("--token-file", help="with --server: bearer token file")
    p.add_argument("--tls-ca", help="with --server: PEM root certificate for a TLS server")
    p.add_argument("--ray-address", help="join this Ray cluster; default: start one")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_run)


class _Bar:
    """The whole sweep's progress: cells done, running and kept, rows (and how many came
    from the cache), tokens per second, ETA. A bar on a terminal, a line per cell otherwise."""

    def __init__(self, cells: int, rows: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=rows, unit="row", desc="sweep", file=sys.stderr, disable=None if enabled else True)  # fmt: skip
        self.cells, self.done, self.kept, self.running = cells, 0, 0, ""
        self.lines = enabled and self.bar.disable

    def _post(self, sweep: Any) -> None:
        self.bar.set_postfix_str(f"cells {self.done}/{self.cells} done ({self.kept} already), running {self.running or '-'}, cached rows {sweep.rows_cached}", refresh=True)  # fmt: skip

    def cell_started(self, sweep: Any, cell: Any, rows: int) -> None:
        self.running = cell.cell_id
        self._post(sweep)

    def rows_done(self, sweep: Any, rows: int) -> None:
        self.bar.update(rows)
        self._post(sweep)

    def cell_finished(self, sweep: Any, cell: Any) -> None:
        self.done += 1
        self.kept += cell.kept
        if cell.kept:
            self.bar.update(cell.rows)
        self.running = ""
        self._post(sweep)
        if self.lines:
            how = "already complete" if cell.kept else f"{cell.rows_generated} rows generated, {cell.rows_cached} from the cache"  # fmt: skip
            print(f"[rollout] sweep: cell {self.done}/{self.cells} {cell.cell_id}: {how}", file=sys.stderr, flush=True)  # fmt: skip

    def close(self) -> None:
        self.bar.close()


def _run(args: argparse.Namespace) -> int:
    from rollout.sweeps.spec import load_sweep

    spec, base = load_sweep(args.sweep)
    if args.baseline:
        spec = spec.model_copy(update={"baseline": args.baseline})
    if args.server:
        from rollout.sweeps.remote import follow_remote

        return follow_remote(args, spec, base)
    return _run_here(args, spec, base)


def _run_here(args: argparse.Namespace, spec: Any, base: dict) -> int:
    from rollout.data.sources import Source
    from rollout.sweeps.report import build_report, render_markdown, write_report
    from rollout.sweeps.runner import SweepRunner

    runner = SweepRunner(spec, base, args.output, args.ray_address)
    planned = 0
    for cell in runner.cells:
        inp = cell.job["input"]
        source = Source(inp["path"], inp.get("format", "auto"), inp.get("split"))
        planned += source.num_rows * int(cell.job.get("n", 1))
    bar = _Bar(len(runner.cells), planned, not args.quiet)
    runner.progress = bar
    try:
        sweep = runner.run()
    finally:
        bar.close()
    from dataclasses import asdict

    out = Path(args.output).expanduser().resolve()
    report = build_report(out, asdict(sweep), spec.baseline)
    write_report(out, report)
    print(render_markdown(report))
    print(f"sweep:  {out} ({len(sweep.cells)} cells; {sweep.rows_generated} rows generated, {sweep.rows_cached} from the cache)\n"
          f"report: {out / 'report.html'}, report.md, report.json\n"
          f"digest: {sweep.digest}")  # fmt: skip
    return 0
