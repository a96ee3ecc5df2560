#!/usr/bin/env python
"""Scale of the orchestration, with the synthetic engine, measured in one run (issue [6/7]).

1. Pipeline throughput at infinite engine speed (read Parquet -> seed -> generate ->
   hash -> write Parquet, all in the actors), 64 tokens per row, 1 and 2 actors.
2. The driver as the job grows: rows/s, driver CPU and peak RSS (the `rollout run`
   process only; actors are other processes) at 10^4 .. 10^7 rows (--max-rows).
3. A simulated cluster of real Ray actors: many replicas, each at a simulated speed
   (tokens_per_s), one of them a straggler: dispatch latency, driver CPU per shard, backups.
4. A scheduler-level simulation (rollout/runtime/simulate.py): the real pool scheduler and
   store, simulated replicas and clock: 10M rows in 10,000 shards over 64 replicas, and
   1M rows in 1,000 shards, each in a fresh process: driver CPU per shard, peak RSS,
   dispatch latency.
Prints Markdown; `--write FILE` replaces the section there. A plot of (2) goes to
docs/scale.png when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import publish  # noqa: E402

from rollout.procstat import run_cli_measured  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def prompts(folder: Path, rows: int) -> Path:
    path = folder / f"in-{rows}.parquet"
    if not path.exists():
        writer = None
        for start in range(0, rows, 1_000_000):
            n = min(1_000_000, rows - start)
            table = pa.table({"q": [f"Write about topic {i}." for i in range(start, start + n)]})
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table, row_group_size=100_000)
        writer.close()
    return path


def run_job(folder: Path, name: str, data: dict) -> dict:
    config = folder / f"{name}.yaml"
    data["output"] = str(folder / name)
    config.write_text(yaml.safe_dump(data))
    proc, rss = run_cli_measured("run", str(config), "--quiet", "--json")
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    # the summary is the last JSON line (Ray may print its own lines to stdout too)
    summary = json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])
    summary["driver_rss_mib"] = rss
    return summary


def job(inp: Path, rows_per_shard: int, actors: int, options: dict | None = None, **pool) -> dict:
    return {
        "input": {"path": str(inp)},
        "prompt": {"column": "q"},
        "sampling": {"max_tokens": 64, "ignore_eos": True},
        "engine": {"name": "synthetic", "options": options or {}},
        "pool": {"actors": actors, "cpus_per_actor": pool.pop("cpus", 1), **pool},
        "shard_size": rows_per_shard,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=int, default=10_000_000)
    parser.add_argument("--pipeline-rows", type=int, default=1_000_000)
    parser.add_argument("--sim-replicas", type=int, default=16)
    parser.add_argument("--sim-shards", type=int, default=1_000)
    parser.add_argument("--cluster-rows", type=int, default=10_000_000)
    parser.add_argument("--cluster-replicas", type=int, default=64)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        t = Path(tmp)
        pipe = {}
        for actors in (1, 2):
            inp = prompts(t, args.pipeline_rows)
            s = run_job(t, f"pipe{actors}", job(inp, 10_000, actors))
            # rows per second of generation, Ray start and engine start excluded as far as
            # the summary allows: seconds covers the run from input checks to the manifest
            pipe[actors] = s
            print(
                f"pipeline {actors} actors: {s['rows'] / s['seconds']:.0f} rows/s", file=sys.stderr
            )
        growth = []
        size = 10_000
        while size <= args.max_rows:
            inp = prompts(t, size)
            s = run_job(t, f"grow{size}", job(inp, max(1_000, size // 100), 2))
            growth.append((size, s))
            print(f"{size} rows: {s['rows'] / s['seconds']:.0f} rows/s, driver {s['driver_rss_mib']:.0f} MiB",
                  file=sys.stderr)  # fmt: skip
            size *= 10
        rows = args.sim_shards * 50
        inp = prompts(t, rows)
        options = {
            "tokens_per_s": 64 * 50 / 0.5,
            "slow_claim_file": str(t / "slow"),
            "slow_factor": 8,
        }
        sim = run_job(t, "sim", job(inp, 50, args.sim_replicas, options, cpus=2 / args.sim_replicas,
                                    backup_after=3.0, backup_min_s=1.0))  # fmt: skip
    cluster = {rows: simulated(rows, args.cluster_replicas)
               for rows in (args.cluster_rows // 10, args.cluster_rows)}  # fmt: skip
    lines = [
        "## Scale: the synthetic engine and the driver (`scripts/bench_scale.py`)",
        "",
        "The `synthetic` engine (no model: tokens from seq_seed, position and prompt) through the "
        "real pipeline: Ray actors read Parquet, seed, generate, hash and write Parquet; the "
        "driver plans shards, dispatches, records (a journal append per batch of finished "
        "shards) and hashes the run digest at the end. 64 output tokens per row, 2 cores. "
        "Measured in one run, side by side.",
        "",
        "| pipeline, infinite engine speed | rows | seconds | rows/s | rows/s per actor-core (wall) | actor CPU s | rows per actor CPU-second |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for actors, s in pipe.items():
        rate = s["rows"] / s["seconds"]
        lines.append(
            f"| {actors} actor(s) | {s['rows']:,} | {s['seconds']:.1f} | {rate:,.0f} | {rate / actors:,.0f} "
            f"| {s['actor_cpu_s']:.1f} | {s['rows'] / s['actor_cpu_s']:,.0f} |"
        )
    lines += [
        "",
        f"- **ratio 2 actors / 1 actor: {(pipe[2]['rows'] / pipe[2]['seconds']) / (pipe[1]['rows'] / pipe[1]['seconds']):.2f}**; "
        "the seconds include Ray's start and the engines' start, so small jobs understate the rate",
        "- one actor has a core to itself; two share the 2 cores with the driver and Ray. Rows per "
        "actor CPU-second divide the rows by the CPU time the actors spent on their shards (each "
        "actor process, all its threads: Arrow's and Ray's included)",
        "",
        "| rows | shards | rows/s | driver CPU s | driver CPU ms per shard | driver peak RSS (MiB) | dispatch p50 / p99 ms |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for size, s in growth:
        lines.append(f"| {size:,} | {s['shards']:,} | {s['rows'] / s['seconds']:,.0f} | {s['driver_cpu_s']:.1f} | "
                     f"{1000 * s['driver_cpu_s'] / s['shards']:.1f} | {s['driver_rss_mib']:.0f} | "
                     f"{s['dispatch_latency_p50_ms']:.1f} / {s['dispatch_latency_p99_ms']:.1f} |")  # fmt: skip
    first, last = growth[0][1], growth[-1][1]
    wall, cpu = last["rows"] / last["seconds"] / 2, last["rows"] / last["actor_cpu_s"]
    lines += [
        "",
        f"- **driver peak RSS {growth[-1][0]:,} / {growth[0][0]:,} rows: "
        f"{last['driver_rss_mib'] / first['driver_rss_mib']:.2f}** ({first['driver_rss_mib']:.0f} -> "
        f"{last['driver_rss_mib']:.0f} MiB; target < 500 MiB and flat)",
        f"- steady state at {growth[-1][0]:,} rows: **{wall:,.0f} rows/s per actor-core** by the wall clock "
        f"(target 30,000: {'met' if wall >= 30_000 else 'not met'}), with the 2 actors sharing the 2 cores "
        f"with the driver and Ray; by the actors' own CPU time, **{cpu:,.0f} rows per actor CPU-second** "
        f"({'met' if cpu >= 30_000 else 'not met'}); the driver used {last['driver_cpu_s']:.1f} s of CPU "
        f"for the {last['rows']:,} rows",
        "",
        f"Simulated cluster: {args.sim_replicas} replicas (Ray actors) at a simulated "
        f"{options['tokens_per_s']:,.0f} output tokens/s each, one of them {options['slow_factor']:.0f}x "
        f"slower (a straggler), {rows:,} rows in {args.sim_shards:,} shards of 50:",
        "",
        f"- {sim['rows']:,} rows in {sim['seconds']:.1f} s; driver CPU {sim['driver_cpu_s']:.1f} s = "
        f"**{1000 * sim['driver_cpu_s'] / sim['shards']:.1f} ms per shard**; driver peak RSS "
        f"{sim['driver_rss_mib']:.0f} MiB; dispatch latency p50 {sim['dispatch_latency_p50_ms']:.1f} ms, "
        f"p99 {sim['dispatch_latency_p99_ms']:.1f} ms",
        f"- straggler: {sim['backup_copies']} backup copies started on idle replicas; every row once "
        "(the digest is checked by the tests, `tests/runtime/test_scale.py`)",
        "",
        f"Scheduler-level simulation (`rollout/runtime/simulate.py`): the real `ShardPool` scheduler "
        f"and the real store (journal appends, manifest snapshots, in a real run directory) with "
        f"{args.cluster_replicas} simulated replicas at 28,000 output tokens/s each (a DeepInfer node: one "
        "DEP8 replica), 64 tokens per row, shards of 1,000 rows (+-25%), one replica 8x slower; "
        "the clock jumps from one completion to the next, so only the driver's work is measured. "
        "Each row is a fresh process:",
        "",
        "| rows | shards | simulated job (s) | driver CPU s | driver CPU ms per shard | driver peak RSS (MiB) | dispatch p50 / p99 ms | backups | journal appends |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rows, c in cluster.items():
        lines.append(f"| {rows:,} | {c['shards']:,} | {c['simulated_s']:,.0f} | {c['driver_cpu_s']:.1f} | "
                     f"{c['driver_cpu_ms_per_shard']:.2f} | {c['driver_peak_rss_mib']:.0f} | "
                     f"{c['dispatch_p50_ms']:.2f} / {c['dispatch_p99_ms']:.2f} | {c['backup_copies']} | "
                     f"{c['journal_appends']:,} |")  # fmt: skip
    small, big = cluster[args.cluster_rows // 10], cluster[args.cluster_rows]
    per_shard_s = big["driver_cpu_ms_per_shard"] / 1000
    lines += [
        "",
        f"- **driver peak RSS {args.cluster_rows:,} / {args.cluster_rows // 10:,} rows: "
        f"{big['driver_peak_rss_mib'] / small['driver_peak_rss_mib']:.2f}** "
        f"({small['driver_peak_rss_mib']:.0f} -> {big['driver_peak_rss_mib']:.0f} MiB; target < 500 MiB)",
        f"- at {big['driver_cpu_ms_per_shard']:.2f} ms of driver CPU per 1,000-row shard, one driver core "
        f"records {1000 / per_shard_s:,.0f} rows/s: the 28,000 rows/s of 1,000 nodes use "
        f"{28 * per_shard_s * 100:.1f}% of it (Ray's per-call cost comes on top: about "
        f"{1000 * sim['driver_cpu_s'] / sim['shards']:.1f} ms per shard with real actors, above)",
        "",
        "![rows/s and driver peak RSS against rows](scale.png)",
    ]
    publish("\n".join(lines), args.write)
    _plot(growth)


SIMULATE = """
import json, sys, tempfile
from dataclasses import asdict
from pathlib import Path
from rollout.runtime.simulate import simulate_job
rows, replicas = int(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp:
    report = simulate_job(Path(tmp) / "run", rows, 1_000, replicas, slow_factor=8)
print(json.dumps(asdict(report)))
"""


def simulated(rows: int, replicas: int) -> dict:
    """A scheduler-level simulation in a fresh process (its peak RSS is the driver's own)."""
    proc = subprocess.run([sys.executable, "-c", SIMULATE, str(rows), str(replicas)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"simulation of {rows} rows failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"simulated {rows} rows: {report['driver_cpu_ms_per_shard']:.2f} ms/shard, "
          f"{report['driver_peak_rss_mib']:.0f} MiB", file=sys.stderr)  # fmt: skip
    return report


def _plot(growth: list) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    xs = [g[0] for g in growth]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.2))
    ax[0].plot(xs, [g[1]["rows"] / g[1]["seconds"] for g in growth], "o-")
    ax[0].set(xscale="log", xlabel="rows", ylabel="rows/s", title="throughput")
    ax[1].plot(xs, [g[1]["driver_rss_mib"] for g in growth], "o-")
    ax[1].set(xscale="log", xlabel="rows", ylabel="MiB", title="driver peak RSS", ylim=(0, None))
    fig.tight_layout()
    fig.savefig(ROOT / "docs" / "scale.png", dpi=100)


if __name__ == "__main__":
    main()
