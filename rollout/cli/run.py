"""`rollout run CONFIG`: run a job locally (a Ray runtime of its own) or on a Ray cluster."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rollout.jobs.spec import load_job_spec


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a rollout job from a YAML/JSON config",
        description="Run a job. Flags override the config; none of them changes config_hash. "
        "Rerunning into the same output directory resumes an unfinished run of the same config.",
    )
    p.add_argument("config", help="the job spec (YAML or JSON)")
    p.add_argument("--output", help="output directory (config: output)")
    p.add_argument("--actors", type=int, help="number of engine actors (config: pool.actors)")
    p.add_argument("--shard-size", type=int, help="input rows per shard (config: shard_size)")
    p.add_argument(
        "--ray-address", help="join this Ray cluster ('auto' for the local one); default: start one"
    )
    p.add_argument("--cache", help="a generation cache directory (config: cache): rows it holds are not generated again")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rollout.runtime.runner import JobRunner

    overrides = {"output": args.output, "pool.actors": args.actors, "shard_size": args.shard_size,
                 "cache": args.cache}  # fmt: skip
    spec = load_job_spec(args.config, overrides)
    bar = _ProgressBar(enabled=not args.quiet)
    runner = JobRunner(spec, ray_address=args.ray_address, progress=bar)
    try:
        summary = runner.run()
    except KeyboardInterrupt:
        bar.close()
        print(
            f"rollout: interrupted; complete shards are kept in {runner.out}. "
            "Run the same command again to resume.",
            file=sys.stderr,
        )
        return 130
    finally:
        bar.close()
    if args.json:
        print(json.dumps(asdict(summary)))
    else:
        print(
            f"done: {summary.rows} rows ({summary.input_rows} prompts x n, {summary.skipped_rows} skipped), "
            f"{summary.output_tokens} output tokens in {summary.seconds:.1f} s "
            f"({summary.output_tokens_per_s:.1f} tok/s), {summary.shards} shards "
            f"({summary.shards_resumed} resumed)"
            + (
                f", {summary.rows_cached} rows from the cache, {summary.rows_generated} generated"
                if spec.cache
                else ""
            )
            + "\n"
            f"output:     {summary.output}/data\n"
            f"run_digest: {summary.run_digest}\n"
            f"config:     {summary.config_hash}"
        )
        if summary.score_digest:
            print(scores_line(Path(summary.output)) + f"\nscore_digest: {summary.score_digest}")
    return 0


def scores_line(run: Path) -> str:
    """Each score's mean and 95% interval from the run's scores.json, on one line."""
    import json

    metrics = json.loads((run / "scores.json").read_text(encoding="utf-8"))["metrics"]
    parts = []
    for name, m in metrics.items():
        ci = m["ci95"]
        mean = "n/a" if m["mean"] is None else f"{m['mean']:.4g}"
        parts.append(f"{name} {mean}" + (f" [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else ""))
        for k, p in m.get("pass_at_k", {}).items():
            parts.append(f"{name} pass@{k} {p['mean']:.4g}")
    return "scores:     " + "; ".join(parts)


class _ProgressBar:
    """Rows, shards, output tokens/s and ETA on stderr, updated as shards complete."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.started = time.monotonic()
        self.tokens = 0

    def start(self, manifest) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        self.started = time.monotonic()
        done = sum(s.end - s.start for s in manifest.shards if s.complete)
        self.bar = tqdm(
            total=manifest.input_rows,
            initial=done,
            unit="prompt",
            file=sys.stderr,
            dynamic_ncols=True,
        )
        self.bar.set_postfix_str(f"shards {manifest.done}/{len(manifest.shards)}")

    def shard_done(self, result, manifest) -> None:
        if self.bar is None:
            return
        self.tokens += result.output_tokens
        rate = self.tokens / max(time.monotonic() - self.started, 1e-9)
        self.bar.set_postfix_str(
            f"shards {manifest.done}/{len(manifest.shards)}, {rate:.0f} out tok/s"
        )
        self.bar.update(result.end - result.start)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
