"""The actor pool: hands shards to idle actors, retries shards whose actor died.

The driver keeps only what is in flight (a few shards per actor). A dead actor
(`RayActorError`) is replaced by a new one, and its shards go back to the front of the
queue, to run on whichever actor is free next, up to `max_shard_retries` times each.
A replacement gets no shard until its engine has started (a DeepInfer replica's cold
start takes minutes: the others keep working meanwhile), and at most
`pool.max_actor_restarts` replacements are made in a run, so a broken node cannot make
the pool thrash. An error raised by the work itself (bad input, an engine error) is not
retried: it stops the job with that error.
"""

from __future__ import annotations

import functools
import logging
import re
import statistics
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from rollout.errors import EngineError, JobCancelled, first_line
from rollout.jobs.spec import JobSpec
from rollout.runtime import cluster
from rollout.runtime.actor import EngineWorker, actor_env, release_resource_group
from rollout.runtime.shard import ShardResult, ShardTask

log = logging.getLogger(__name__)


@functools.cache
def _remote_worker() -> Any:
    """The engine actor class, made once per process: Ray keeps every class made with
    `ray.remote` for the life of the driver (about 10 KiB each), so one per job would grow
    a long-lived service without bound. Each pool sets its own options on it."""
    return ray.remote(EngineWorker)


class RayRuntime:
    """What the pool asks of Ray: engine actors, waiting on their calls, a clock. The one
    other implementation is the simulated cluster (rollout/runtime/simulate.py), which
    drives this same scheduler with simulated actors and a simulated clock."""

    def __init__(self, actor_args: tuple, num_cpus: float, num_gpus: float) -> None:
        self._cls = _remote_worker().options(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            max_restarts=0,
            runtime_env={"env_vars": actor_env(actor_args[0])},
        )
        self._args = actor_args

    def start_actor(self) -> Any:
        return self._cls.remote(*self._args)

    def wait(self, refs: list, num_returns: int, timeout: float) -> tuple[list, list]:
        return ray.wait(refs, num_returns=num_returns, timeout=timeout)

    def get(self, ref: Any) -> Any:
        return ray.get(ref)

    def kill(self, actor: Any) -> None:
        ray.kill(actor, no_restart=True)

    def release(self, actor: Any) -> None:
        """Free what a dead actor's engine reserved (its placement group)."""
        release_resource_group(actor._actor_id.hex())

    now = staticmethod(time.monotonic)


class ShardPool:
    @classmethod
    def for_job(
        cls, spec: JobSpec, shard_dir: str, row_counts: list[int], size: int | None = None,
        roots: tuple[str, ...] = (),
    ) -> ShardPool:  # fmt: skip
        """A pool of `size` (default pool.actors) engine actors for the job; with `roots`,
        the actors read and write under them without following symlinks."""
        p = spec.pool
        runtime = RayRuntime((spec.model_dump_json(), shard_dir, row_counts, roots),
                             p.cpus_per_actor, p.gpus_per_actor)  # fmt: skip
        shards = -(-sum(row_counts) // spec.shard_size)
        size = cluster.pool_size(
            size or p.actors, p.cpus_per_actor, p.gpus_per_actor, max(shards, 1)
        )
        pool = cls(size, runtime, p.shards_in_flight_per_actor, p.max_shard_retries,
                   p.restart_budget(), p.backup_after, p.backup_min_s)  # fmt: skip
        pool.start_timeout_s = p.start_timeout_s
        return pool

    def __init__(
        self,
        size: int,
        runtime: Any,
        in_flight_per_actor: int,
        max_retries: int,
        max_restarts: int = 3,
        backup_after: float | None = None,
        backup_min_s: float = 30.0,
    ) -> None:
        self.rt = runtime
        self._in_flight = in_flight_per_actor
        self._max_retries = max_retries
        self._max_restarts = max_restarts
        self.backup_after, self.backup_min_s = backup_after, backup_min_s
        self.backups = 0
        self.retries = 0  # shards run again after their actor died
        self.dispatch_latency: deque[float] = deque(maxlen=100_000)
        self.actors: list[Any] = [self.rt.start_actor() for _ in range(size)]
        self.restarts = 0
        self.lost = False  # the Ray runtime went away: nothing more to ask of it
        self.fingerprint: dict | None = None
        self._starting: dict[int, Any] = {}  # actor slot -> its fingerprint ref, until ready
        self.start_timeout_s = 1800.0
        self._up: set[int] = set()  # actors known to have finished starting

    def engine_fingerprint(self, cancel: threading.Event | None = None) -> dict:
        """The engines' fingerprint, once every engine has started; they must all agree.
        Waits at most `start_timeout_s`, and stops at once when `cancel` is set."""
        refs = [a.fingerprint.remote() for a in self.actors]
        deadline = self.rt.now() + self.start_timeout_s
        pending = list(refs)
        while True:
            waiting = set(pending)
            self._up = {i for i, r in enumerate(refs) if r not in waiting}
            if not pending:
                break
            if cancel is not None and cancel.is_set():
                raise JobCancelled("the job was cancelled while its engine actors started")
            if self.rt.now() > deadline:
                raise EngineError(
                    f"{len(pending)} of {len(refs)} engine actors did not start within "
                    f"{self.start_timeout_s:g} s (pool.start_timeout_s): the cluster has no room "
                    "for them, or their engines are slow to load"
                )
            _, pending = self.rt.wait(pending, num_returns=len(pending), timeout=1.0)
        try:
            prints = [self.rt.get(r) for r in refs]
        except RayTaskError as exc:
            raise _cause(exc) from None
        except RayActorError as exc:
            self._check_cluster(exc)
            raise EngineError(f"an engine actor failed to start: {_creation_error(exc)}") from None
        if any(fp != prints[0] for fp in prints):
            raise EngineError(
                "the engine actors report different fingerprints; a run needs identical engines"
            )
        self.fingerprint = prints[0]
        return prints[0]

    def _check_cluster(self, exc: BaseException) -> None:
        """An actor is gone: if the whole Ray runtime went with it, stop (ClusterLost)."""
        if not cluster.reachable():
            self.lost = True
            raise cluster.lost(exc) from None

    def _replace(self, i: int, exc: BaseException, what: str) -> None:
        self._check_cluster(exc)
        self.restarts += 1
        if self.restarts > self._max_restarts:
            raise EngineError(
                f"engine actors died {self.restarts} times in this run (pool.max_actor_restarts "
                f"is {self._max_restarts}); last: {first_line(exc)}"
            )
        log.warning("actor %d died (%s); starting a new one, %s", i, first_line(exc), what)
        self.rt.release(self.actors[i])
        self.actors[i] = self.rt.start_actor()
        self._starting[i] = self.actors[i].fingerprint.remote()

    def _started(self, i: int, ref: Any) -> None:
        """A replacement's engine is up (or failed to start)."""
        del self._starting[i]
        try:
            fp = self.rt.get(ref)
        except RayTaskError as exc:
            raise _cause(exc) from None
        except RayActorError as exc:
            self._replace(i, exc, "as the last one failed to start")
            return
        if self.fingerprint is not None and fp != self.fingerprint:
            raise EngineError(
                f"a replacement engine actor reports another fingerprint than the run's: {fp}"
            )

    def dispatch_latency_ms(self, q: float) -> float:
        """The q-quantile of dispatch latency in ms: a finished shard seen by the driver ->
        its actor's next shard sent (real time)."""
        latency = sorted(self.dispatch_latency)
        return latency[min(len(latency) - 1, int(q * len(latency)))] * 1000 if latency else 0.0

    def run(
        self, tasks: Iterable[ShardTask], cancel: threading.Event | None = None
    ) -> Iterator[list[ShardResult]]:
        """Run every task; yields the results that completed together, as a batch.

        A shard whose copy has run more than `backup_after` times the median shard time
        (and at least `backup_min_s`) while an actor sits idle gets a backup copy there;
        the first copy to finish is the result, the other is ignored. Both write the
        same bytes to the same file, so either is correct and no row is doubled.
        """
        queue = deque(tasks)
        attempts: Counter[int] = Counter()
        load = [0] * len(self.actors)
        inflight: dict[Any, tuple[int, Any, ShardTask]] = {}
        fifo: list[deque] = [deque() for _ in self.actors]  # refs queued on each actor, head runs
        head_since = [0.0] * len(self.actors)
        durations: deque[float] = deque(maxlen=1000)  # recent shard times, for the median
        copies: dict[
            int, list[Any]
        ] = {}  # shard_id -> refs of its copies (only shards with a backup)
        orphans: dict[Any, int] = {}  # the losing copies still running -> actor slot
        # actor slot -> when its last task was seen done: real time, also under a simulated
        # clock, since dispatch latency is the driver's own work
        freed_at: dict[int, float] = {}
        while queue or inflight:
            now = self.rt.now()
            for i, actor in enumerate(self.actors):
                while queue and load[i] < self._in_flight and i not in self._starting:
                    if i in freed_at:  # how long the driver took to hand this actor more work
                        self.dispatch_latency.append(time.perf_counter() - freed_at.pop(i))
                    task = queue.popleft()
                    ref = actor.run.remote(task)
                    inflight[ref] = (i, actor, task)
                    fifo[i].append(ref)
                    if len(fifo[i]) == 1:
                        head_since[i] = now
                    load[i] += 1
            if not queue:
                self._start_backups(inflight, fifo, head_since, durations, copies, load, now)
            starting = {ref: i for i, ref in self._starting.items()}
            ready, _ = self.rt.wait([*inflight, *starting, *orphans], 1, 0.25)
            if ready:  # take everything that is already done: recorded as one batch
                rest = [r for r in [*inflight, *starting, *orphans] if r not in ready]
                more, _ = self.rt.wait(rest, len(rest), 0) if rest else ([], [])
                ready += more
            if cancel is not None and cancel.is_set():
                raise JobCancelled("the job was cancelled")
            batch: list[ShardResult] = []
            for ref in ready:
                if ref in starting:
                    self._started(starting[ref], ref)
                    continue
                if ref in orphans:
                    i = orphans.pop(ref)
                    self._advance(i, ref, fifo, head_since, load)
                    continue
                i, actor, task = inflight.pop(ref)
                self._advance(i, ref, fifo, head_since, load)
                freed_at.setdefault(i, time.perf_counter())
                try:
                    result = self.rt.get(ref)
                except RayTaskError as exc:
                    raise _cause(exc) from None
                except RayActorError as exc:
                    if self.actors[i] is actor:  # replace each dead actor once
                        self._replace(i, exc, f"shard {task.shard_id} goes to the next free actor")
                        fifo[i].clear()
                        load[i] = 0
                    others = [r for r in copies.get(task.shard_id, []) if r in inflight]
                    if others:  # its other copy is still running: that one will do
                        continue
                    attempts[task.shard_id] += 1
                    self.retries += 1
                    if attempts[task.shard_id] > self._max_retries:
                        raise EngineError(
                            f"shard {task.shard_id} (rows {task.start}..{task.end - 1}) lost its actor "
                            f"{attempts[task.shard_id]} times; last: {first_line(exc)}"
                        ) from None
                    queue.appendleft(task)
                    continue
                durations.append(result.seconds)
                for other in copies.pop(task.shard_id, []):
                    if other in inflight:  # the losing copy: ignored, but let it finish
                        orphans[other] = inflight.pop(other)[0]
                batch.append(result)
            if batch:
                yield batch
        self._end_orphans(orphans)

    def _advance(
        self, i: int, ref: Any, fifo: list[deque], head_since: list[float], load: list[int]
    ) -> None:
        """A task of actor i is done: the next one queued there starts now."""
        if ref in fifo[i]:
            fifo[i].remove(ref)
            load[i] -= 1
            head_since[i] = self.rt.now()

    def _start_backups(self, inflight, fifo, head_since, durations, copies, load, now) -> None:
        if self.backup_after is None or len(durations) < 3:
            return
        limit = max(self.backup_min_s, self.backup_after * statistics.median(durations))
        idle = [i for i in range(len(self.actors)) if load[i] == 0 and i not in self._starting]
        for i in range(len(self.actors)):
            if not idle:
                return
            if not fifo[i] or now - head_since[i] < limit or fifo[i][0] not in inflight:
                continue  # idle, not yet slow, or running a copy that lost already
            ref = fifo[i][0]
            task = inflight[ref][2]
            if task.shard_id in copies:
                continue  # one backup per shard
            j = idle.pop(0)
            backup = self.actors[j].run.remote(task)
            inflight[backup] = (j, self.actors[j], task)
            fifo[j].append(backup)
            head_since[j] = now
            load[j] += 1
            copies[task.shard_id] = [ref, backup]
            self.backups += 1
            log.info("shard %d has run %.0f s on actor %d (median %.1f s): backup copy on actor %d",
                     task.shard_id, now - head_since[i], i, statistics.median(durations), j)  # fmt: skip

    def _end_orphans(self, orphans: dict[Any, int]) -> None:
        """Every shard is done: stop the actors still running losing copies, and wait until
        they are gone, so that nothing writes into the run after it is finished."""
        for i in set(orphans.values()):
            self.rt.kill(self.actors[i])
        if orphans:
            self.rt.wait(list(orphans), len(orphans), 60)
            for i in set(orphans.values()):
                self.rt.release(self.actors[i])
                self.actors[i] = self.rt.start_actor()
                self._starting[i] = self.actors[i].fingerprint.remote()

    def shutdown(self, timeout: float = 60.0) -> None:
        """Close every engine (freeing what it reserved), then end the actors."""
        if self.lost:  # the runtime took the actors with it
            return
        # An actor still in its constructor cannot answer close() until it has started (an
        # engine load can take minutes): before every engine has started, only those known
        # to have started are asked to close; the rest are killed.
        started = self.actors if self.fingerprint is not None else [self.actors[i] for i in sorted(self._up)]  # fmt: skip
        closing = [a.close.remote() for a in started]
        self.rt.wait(closing, len(closing), timeout)
        for actor in self.actors:
            self.rt.kill(actor)
            self.rt.release(actor)


def _cause(exc: RayTaskError) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _creation_error(exc: BaseException) -> str:
    """The error an actor's constructor raised, from the traceback Ray keeps as text."""
    text = str(getattr(exc, "error_msg", "") or exc)
    found = re.findall(r"^rollout\.errors\.\w+: (.+)$", text, flags=re.M)
    return found[-1] if found else first_line(exc)
