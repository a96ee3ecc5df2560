"""`rollout sweep ... --server ADDR`: the sweep runs in the service, which outlives this
client. The submission's request id is derived from the sweep and its output, so running
the same command again re-attaches to the same sweep (and never queues a cell twice);
`--detach` submits and returns, `--cancel` cancels every cell that has not ended."""

from __future__ import annotations

import argparse
import hashlib
import sys
from typing import Any

from rollout import determinism
from rollout.sweeps.spec import SweepSpec


def request_id_of(spec: dict[str, Any], output: str) -> str:
    digest = hashlib.sha256(
        determinism.canonical_json({"spec": spec, "output": output})
    ).hexdigest()
    return f"sweep-{digest[:32]}"


def follow_remote(args: argparse.Namespace, spec: SweepSpec, base: dict[str, Any]) -> int:
    from tqdm import tqdm

    from rollout.cli.jobs import client_from_args
    from rollout.client import state_name

    data = spec.model_dump(mode="json") | {"base": base}
    client = client_from_args(args)
    sweep = client.submit_sweep(data, args.output, request_id_of(data, args.output))
    print(f"sweep {sweep.sweep_id}: {len(sweep.cells)} cells on {args.server}, output {sweep.output}", file=sys.stderr)  # fmt: skip
    if args.cancel:
        sweep = client.cancel_sweep(sweep.sweep_id)
        print(f"sweep {sweep.sweep_id}: cancel requested ({state_name(sweep)})")
        return 0
    if args.detach:
        print(f"detached; run the same command again to follow it (sweep {sweep.sweep_id})")
        return 0
    bar = tqdm(total=sweep.rows_total, unit="row", desc="sweep", file=sys.stderr, disable=True if args.quiet else None)  # fmt: skip
    seen_done: set[str] = set()
    try:
        for sweep in client.watch_sweep(sweep.sweep_id):  # noqa: B020 - the latest state is wanted
            states = [state_name(c) for c in sweep.cells]
            rows = sum(c.progress.rows for c in sweep.cells)
            cached = sum(c.progress.rows_cached for c in sweep.cells)
            bar.n = rows
            bar.set_postfix_str(f"cells {states.count('SUCCEEDED')}/{len(states)} done, {states.count('RUNNING')} running, {states.count('QUEUED')} queued, cached rows {cached}", refresh=True)  # fmt: skip
            if bar.disable and not args.quiet:
                for c in sweep.cells:
                    if (
                        state_name(c) in ("SUCCEEDED", "FAILED", "CANCELLED")
                        and c.cell_id not in seen_done
                    ):
                        seen_done.add(c.cell_id)
                        print(f"[rollout] sweep: cell {c.cell_id} {state_name(c)} ({c.progress.rows} rows, {c.progress.rows_cached} from the cache)", file=sys.stderr, flush=True)  # fmt: skip
    except KeyboardInterrupt:
        bar.close()
        print(f"rollout: stopped following; sweep {sweep.sweep_id} goes on in the service. Run the same command again to follow it.", file=sys.stderr)  # fmt: skip
        return 130
    bar.close()
    state = state_name(sweep)
    if state != "SUCCEEDED":
        failed = [f"{c.cell_id}: {c.error}" for c in sweep.cells if c.error]
        print(f"rollout: sweep {sweep.sweep_id} ended {state}" + (f"; {failed[0]}" if failed else ""), file=sys.stderr)  # fmt: skip
        return 1
    print(sweep.report_markdown)
    print(f"sweep:  {sweep.output} on {args.server}\nreport: {sweep.output}/report.html, report.md, report.json\ndigest: {sweep.digest}")  # fmt: skip
    return 0
