#!/usr/bin/env python
"""Soak: one `rollout serve` under a mixed load of submissions, cancellations and watches.

One service (a real process, a real gRPC server on loopback, the synthetic engine) runs
for --seconds while client threads keep it busy:
  - a submitter keeps up to --backlog jobs open: short jobs (kind A), slow jobs (kind B,
    the ones that get cancelled) and bad specs (must be refused with INVALID_ARGUMENT);
    it also lists and gets jobs;
  - a canceller cancels a random open B job every few seconds;
  - a watcher follows random jobs to their end over WatchJob;
  - a sampler reads the service's RSS, open file descriptors and the processes in its
    session (Ray's included) every --sample-every seconds.
Then no more work is sent, every job is waited for, and the result is checked: every job
ended as expected (A and B succeeded with the one digest of their kind, or were
cancelled by us), every bad spec was refused, no call failed unexpectedly, and the service
still answers its health check. Prints Markdown (--write replaces the section in a file),
--json writes the figures; exits 1 if anything unexpected happened.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import publish  # noqa: E402


def spec(root: Path, kind: str, n: int) -> dict:
    """Kind A: short; B: slow (8 s), to be cancelled; bad: a sampling value out of range."""
    rows, shard, speed = (40, 10, 0) if kind == "A" else (200, 20, 200)
    options = {"mean_output_len": 8, **({"tokens_per_s": speed} if speed else {})}
    return {
        "input": {"path": str(root / f"in-{rows}.parquet")},
        "prompt": {"column": "q"},
        "n": 2,
        "job_seed": 7,
        "sampling": {"temperature": -1.0 if kind == "bad" else 0.9, "max_tokens": 12},
        "engine": {"name": "synthetic", "options": options},
        "pool": {"actors": 2, "cpus_per_actor": 0.5},
        "shard_size": shard,
        "output": str(root / "out" / f"{kind}-{n}"),
    }


@dataclass
class Sample:
    t: float
    rss_mib: float
    fds: int
    processes: int


@dataclass
class Tally:
    submitted: dict[str, int] = field(default_factory=lambda: {"A": 0, "B": 0})
    refused: int = 0  # bad specs refused with INVALID_ARGUMENT, as they must be
    cancels: int = 0
    watches: int = 0
    reads: int = 0  # GetJob / ListJobs
    unexpected: list[str] = field(default_factory=list)


class Soak:
    def __init__(self, address: str, root: Path, seconds: float, backlog: int, seed: int) -> None:
        from rollout.client import RolloutClient

        self.client = RolloutClient(address)
        self.root, self.seconds, self.backlog = root, seconds, backlog
        self.rng = random.Random(seed)
        self.jobs: dict[str, str] = {}  # job id -> kind
        self.cancelled: set[str] = set()
        self.tally = Tally()
        self.lock = threading.Lock()
        self.deadline = time.monotonic() + seconds

    def unexpected(self, what: str) -> None:
        with self.lock:
            self.tally.unexpected.append(what)
        print(f"[soak] UNEXPECTED: {what}", file=sys.stderr, flush=True)

    def open_jobs(self, kind: str | None = None) -> list[str]:
        from rollout.client import FINAL_STATES, state_name

        with self.lock:
            ids = [j for j, k in self.jobs.items() if kind is None or k == kind]
        return [j for j in ids[-50:] if state_name(self.client.get(j)) not in FINAL_STATES]

    def submitter(self) -> None:
        import grpc

        n = 0
        while time.monotonic() < self.deadline:
            roll = self.rng.random()
            try:
                if roll < 0.1:
                    self.tally.reads += 1
                    list(self.client.list(page_size=20))
                elif roll < 0.2:
                    try:
                        self.client.submit(spec(self.root, "bad", n))
                        self.unexpected("a bad spec (temperature -1) was accepted")
                    except grpc.RpcError as exc:
                        if exc.code() != grpc.StatusCode.INVALID_ARGUMENT or "temperature" not in (
                            exc.details() or ""
                        ):
                            self.unexpected(f"bad spec refused with {exc.code()}: {exc.details()}")
                        self.tally.refused += 1
                elif len(self.open_jobs()) < self.backlog:
                    kind = "B" if roll < 0.45 else "A"
                    job = self.client.submit(spec(self.root, kind, n))
                    with self.lock:
                        self.jobs[job.job_id] = kind
                        self.tally.submitted[kind] += 1
                n += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted, none hidden
                self.unexpected(f"submitter: {type(exc).__name__}: {exc}")
            time.sleep(0.3)

    def canceller(self) -> None:
        while time.monotonic() < self.deadline:
            time.sleep(self.rng.uniform(2, 5))
            try:
                open_b = self.open_jobs("B")
                if open_b and self.rng.random() < 0.5:  # about half the slow jobs finish
                    victim = self.rng.choice(open_b)
                    with self.lock:
                        self.cancelled.add(victim)
                    self.client.cancel(victim)
                    self.tally.cancels += 1
            except Exception as exc:  # noqa: BLE001
                self.unexpected(f"canceller: {type(exc).__name__}: {exc}")

    def watcher(self) -> None:
        from rollout.client import FINAL_STATES, state_name

        while time.monotonic() < self.deadline:
            with self.lock:
                ids = list(self.jobs)
            if not ids:
                time.sleep(0.5)
                continue
            job_id = self.rng.choice(ids[-10:])
            try:
                events = list(self.client.watch(job_id))
                if not events or state_name(events[-1]) not in FINAL_STATES:
                    self.unexpected(f"watch of {job_id} ended before the job did")
                self.tally.watches += 1
            except Exception as exc:  # noqa: BLE001
                self.unexpected(f"watcher: {type(exc).__name__}: {exc}")

    def drain(self, timeout: float) -> dict[str, dict[str, int]]:
        """Wait for every job to end; check how each ended. Returns counts per kind."""
        from rollout.client import state_name

        end = time.monotonic() + timeout
        while self.open_jobs() and time.monotonic() < end:
            time.sleep(1)
        counts: dict[str, dict[str, int]] = {"A": {}, "B": {}}
        digests: dict[str, set[str]] = {"A": set(), "B": set()}
        for job_id, kind in self.jobs.items():
            job = self.client.get(job_id)
            state = state_name(job)
            counts[kind][state] = counts[kind].get(state, 0) + 1
            if state == "SUCCEEDED":
                digests[kind].add(job.run_digest)
            elif state == "CANCELLED" and job_id in self.cancelled:
                pass
            else:
                self.unexpected(f"job {job_id} ({kind}) ended {state}: {job.error}")
        for kind, found in digests.items():
            if len(found) > 1:
                self.unexpected(f"{len(found)} different run digests among kind {kind}'s jobs")
        if self.client.health() != "SERVING":
            self.unexpected("the health check does not answer SERVING")
        return counts


def start_service(root: Path, state: Path) -> tuple[subprocess.Popen, str]:
    from rollout.client import wait_until_serving

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.Popen([sys.executable, "-m", "rollout.cli.main", "serve", "--address", address,
                             "--state-dir", str(state), "--data-root", str(root),
                             "--max-concurrent-jobs", "2"], start_new_session=True)  # fmt: skip
    if not wait_until_serving(address, alive=lambda: proc.poll() is None):
        proc.kill()
        raise SystemExit("the service did not start")
    return proc, address


def sample(pid: int, started: float) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(next(x for x in status.splitlines() if x.startswith("VmRSS:")).split()[1])
    sid = os.getsid(pid)
    procs = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                procs += os.getsid(int(entry)) == sid
            except OSError:
                continue
    return Sample(
        round(time.monotonic() - started, 1), rss / 1024, len(os.listdir(f"/proc/{pid}/fd")), procs
    )


def trend(samples: list[Sample], attr: str) -> tuple[float, float]:
    """Mean of the first and of the last quarter of the samples after the warm-up (the
    first 10% of the run: Ray and the first engines starting)."""
    warm = samples[-1].t / 10
    samples = [s for s in samples if s.t >= warm] or samples
    q = max(1, len(samples) // 4)
    first = [getattr(s, attr) for s in samples[:q]]
    last = [getattr(s, attr) for s in samples[-q:]]
    return sum(first) / len(first), sum(last) / len(last)


def duration(seconds: float) -> str:
    return f"{seconds:.0f} seconds" if seconds < 120 else f"{seconds / 60:.0f} minutes"


def report(
    args: argparse.Namespace, soak: Soak, counts: dict, samples: list[Sample]
) -> tuple[str, dict]:
    t = soak.tally
    rss0, rss1 = trend(samples, "rss_mib")
    fd0, fd1 = trend(samples, "fds")
    p0, p1 = trend(samples, "processes")
    figures = {
        "seconds": args.seconds,
        "submitted": t.submitted,
        "ended": counts,
        "refused_bad_specs": t.refused,
        "cancels": t.cancels,
        "watches": t.watches,
        "reads": t.reads,
        "unexpected": t.unexpected,
        "rss_mib_first_quarter": rss0,
        "rss_mib_last_quarter": rss1,
        "fds_first_quarter": fd0,
        "fds_last_quarter": fd1,
        "processes_first_quarter": p0,
        "processes_last_quarter": p1,
        "samples": [asdict(s) for s in samples],
    }
    done = sum(c.get("SUCCEEDED", 0) for c in counts.values())
    lines = [
        "## Soak: one service under mixed load (`scripts/bench_soak.py`)",
        "",
        f"{duration(args.seconds)} against one `rollout serve` (synthetic engine, 2 jobs at "
        "a time, 2 actors each, 2 cores): short jobs, slow jobs cancelled at random, bad specs, "
        "watches, lists. Measured in one run.",
        "",
        f"- jobs done: **{done}** (short: {counts['A'].get('SUCCEEDED', 0)}, slow: "
        f"{counts['B'].get('SUCCEEDED', 0)}), cancelled by the soak: "
        f"{counts['B'].get('CANCELLED', 0)}, bad specs refused (INVALID_ARGUMENT): {t.refused}, "
        f"watches: {t.watches}, lists: {t.reads}",
        f"- unexpected errors: **{len(t.unexpected)}** (target 0); every job of a kind ended with "
        "the same run digest",
        f"- service RSS, first vs last quarter of the run: {rss0:.0f} -> {rss1:.0f} MiB "
        f"(**ratio {rss1 / rss0:.2f}**, after a warm-up of the first 10%); open fds {fd0:.0f} -> {fd1:.0f}; processes in its "
        f"session (Ray's included) {p0:.0f} -> {p1:.0f}",
        "",
        "| t (s) | service RSS (MiB) | open fds | processes |",
        "| ---: | ---: | ---: | ---: |",
    ]
    step = max(1, len(samples) // 12)
    for s in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
        lines.append(f"| {s.t:.0f} | {s.rss_mib:.0f} | {s.fds} | {s.processes} |")
    return "\n".join(lines), figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1800)
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--backlog", type=int, default=4, help="open jobs kept at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", type=Path, help="replace the section in this Markdown file")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp:
        root = Path(tmp)
        for rows in (40, 200):
            pq.write_table(
                pa.table({"q": [f"Question {i}?" for i in range(rows)]}),
                root / f"in-{rows}.parquet",
            )
        proc, address = start_service(root, root / "state")
        started = time.monotonic()
        samples: list[Sample] = []
        try:
            soak = Soak(address, root, args.seconds, args.backlog, args.seed)
            threads = [
                threading.Thread(target=f, daemon=True)
                for f in (soak.submitter, soak.canceller, soak.watcher)
            ]
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads[:2]):
                samples.append(sample(proc.pid, started))
                print(f"[soak] {samples[-1].t:.0f}/{args.seconds:.0f} s: {sum(soak.tally.submitted.values())} "
                      f"jobs, RSS {samples[-1].rss_mib:.0f} MiB, {samples[-1].fds} fds",
                      file=sys.stderr, flush=True)  # fmt: skip
                time.sleep(args.sample_every)
            counts = soak.drain(timeout=300)
            samples.append(sample(proc.pid, started))
            text, figures = report(args, soak, counts, samples)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    publish(text, args.write)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 1 if figures["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
