"""A simulated cluster: the real scheduler and store, simulated engines and clock.

`simulate_job` plans a job's shards like `JobRunner`, drives them through the real
`ShardPool.run` (dispatch, in-flight limits, retries, straggler backups) and records them
with the real `record_batches` (journal appends, manifest snapshots) into a real run
directory. Only the engine actors are simulated: each takes a shard's rows x tokens /
tokens_per_s of *simulated* time, and the clock jumps to the next completion instead of
sleeping. So 10,000 shards over 64 replicas run in seconds on two cores, and what is
measured is the driver alone: its CPU time per shard, its memory, and how long it takes
to hand an idle replica its next shard (in real time).

Not simulated: nothing is generated or written but the store (no shard files), so the
run digest is not computed; Ray's own per-call cost is not in the figures (it is in the
real-actor measurements of scripts/bench_scale.py).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.procstat import peak_rss_mib
from rollout.runtime.manifest import Manifest
from rollout.runtime.recorder import record_batches
from rollout.runtime.shard import ShardResult, ShardTask


@dataclass(eq=False)
class SimRef:
    """A pending call: done at `done_at` on the simulated clock."""

    done_at: float
    value: Any
    actor: SimActor | None = None


class _Method:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


class SimActor:
    """One simulated replica: runs its shards one after another at `tokens_per_s`."""

    def __init__(self, cluster: SimCluster, slow: float) -> None:
        self.cluster, self.slow = cluster, slow
        self.free_at = cluster.clock
        self.dead = False
        fp = {"engine": "simulated"}
        self.fingerprint = _Method(lambda: SimRef(cluster.clock, fp, self))
        self.close = _Method(lambda: SimRef(cluster.clock, None, self))
        self.run = _Method(self._run)

    def _run(self, task: ShardTask) -> SimRef:
        c = self.cluster
        rows = (task.end - task.start) * c.samples
        digest = hashlib.sha256(f"simulated shard {task.shard_id}".encode()).hexdigest()
        jitter = 0.75 + 0.5 * int(digest[:8], 16) / 0xFFFFFFFF  # shards differ by +-25%
        seconds = rows * c.tokens_per_row / c.tokens_per_s * self.slow * jitter
        start = max(self.free_at, c.clock)
        self.free_at = start + seconds
        result = ShardResult(task.shard_id, task.start, task.end, task.file_name, rows, digest,
                             0, rows * c.tokens_per_row, seconds)  # fmt: skip
        return SimRef(self.free_at, result, self)


@dataclass
class SimCluster:
    """The runtime the pool drives (the same calls as pool.RayRuntime), with a clock that
    jumps from one completion to the next. Replica 0 is `slow_factor` times slower."""

    tokens_per_s: float
    tokens_per_row: int
    samples: int = 1
    slow_factor: float = 1.0
    clock: float = 0.0
    _made: itertools.count = field(default_factory=itertools.count)

    def start_actor(self) -> SimActor:
        return SimActor(self, self.slow_factor if next(self._made) == 0 else 1.0)

    def now(self) -> float:
        return self.clock

    def wait(self, refs: list, num_returns: int, timeout: float) -> tuple[list, list]:
        def done(r: SimRef) -> bool:
            return r.done_at <= self.clock or (r.actor is not None and r.actor.dead)

        ready = [r for r in refs if done(r)]
        if len(ready) < num_returns and timeout > 0:
            pending = [r.done_at for r in refs if not done(r)]
            step = min(pending) - self.clock if pending else timeout
            self.clock += min(step, timeout)  # simulated waiting: no real time passes
            ready = [r for r in refs if done(r)]
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: SimRef) -> Any:
        return ref.value

    def kill(self, actor: SimActor) -> None:
        actor.dead = True

    def release(self, actor: SimActor) -> None:
        pass


@dataclass
class SimReport:
    rows: int
    shards: int
    replicas: int
    simulated_s: float  # simulated wall time of the job
    driver_cpu_s: float
    driver_cpu_ms_per_shard: float
    driver_peak_rss_mib: float  # this process's high-water mark (VmHWM)
    dispatch_p50_ms: float
    dispatch_p99_ms: float
    backup_copies: int
    journal_appends: int
    shards_recorded_twice: int  # a straggler's backup must never make this more than 0


def simulate_job(
    out: Path,
    rows: int,
    shard_size: int,
    replicas: int,
    tokens_per_row: int = 64,
    tokens_per_s: float = 28_000.0,  # a DeepInfer node (one DEP8 replica), DEEPINFER.md
    slow_factor: float = 1.0,
    in_flight_per_actor: int = 2,
    backup_after: float | None = 3.0,
) -> SimReport:
    """Run a simulated job of `rows` rows into the run directory `out` (its manifest and
    journal are real); one replica is `slow_factor` times slower than the others."""
    from rollout.runtime.pool import ShardPool
    from rollout.runtime.runner import plan_shards

    out.mkdir(parents=True, exist_ok=True)
    cpu0 = time.process_time()
    shards = plan_shards(rows, shard_size)
    manifest = Manifest("simulated", {}, {"engine": "simulated"}, rows, shard_size, shards)
    manifest.save(out)
    cluster = SimCluster(tokens_per_s, tokens_per_row, slow_factor=slow_factor)
    pool = ShardPool(replicas, cluster, in_flight_per_actor, max_retries=3,
                     backup_after=backup_after, backup_min_s=0.0)  # fmt: skip
    pool.engine_fingerprint()
    appends = 0

    def batches():
        nonlocal appends
        for batch in pool.run(ShardTask(s.shard_id, s.start, s.end) for s in shards):
            appends += 1
            yield batch

    recorded: set[int] = set()
    twice = 0

    def seen(result: ShardResult) -> None:
        nonlocal twice
        twice += result.shard_id in recorded
        recorded.add(result.shard_id)

    record_batches(out, manifest, batches(), seen)
    manifest.status = "complete"
    manifest.save(out)
    cpu = time.process_time() - cpu0
    return SimReport(
        rows=rows,
        shards=len(shards),
        replicas=replicas,
        simulated_s=cluster.clock,
        driver_cpu_s=cpu,
        driver_cpu_ms_per_shard=cpu / len(shards) * 1000,
        driver_peak_rss_mib=peak_rss_mib(),
        dispatch_p50_ms=pool.dispatch_latency_ms(0.5),
        dispatch_p99_ms=pool.dispatch_latency_ms(0.99),
        backup_copies=pool.backups,
        journal_appends=appends,
        shards_recorded_twice=twice,
    )
