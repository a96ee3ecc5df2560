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

import sys
import threading
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from rollout.errors import EngineError, JobCancelled
from rollout.jobs.spec import JobSpec
from rollout.runtime.actor import EngineWorker, actor_env, release_resource_group
from rollout.runtime.shard import ShardResult, ShardTask


class ShardPool:
    @classmethod
    def for_job(
        cls, spec: JobSpec, shard_dir: str, row_counts: list[int], size: int | None = None
    ) -> ShardPool:
        """A pool of `size` (default pool.actors) engine actors for the job."""
        p = spec.pool
        return cls(size or p.actors, (spec.model_dump_json(), shard_dir, row_counts), p.cpus_per_actor,
                   p.gpus_per_actor, p.shards_in_flight_per_actor, p.max_shard_retries,
                   p.restart_budget())  # fmt: skip

    def __init__(
        self,
        size: int,
        actor_args: tuple,
        num_cpus: float,
        num_gpus: float,
        in_flight_per_actor: int,
        max_retries: int,
        max_restarts: int = 3,
    ) -> None:
        self._cls = ray.remote(EngineWorker).options(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            max_restarts=0,
            runtime_env={"env_vars": actor_env()},
        )
        self._args = actor_args
        self._in_flight = in_flight_per_actor
        self._max_retries = max_retries
        self._max_restarts = max_restarts
        self.actors: list[Any] = [self._cls.remote(*self._args) for _ in range(size)]
        self.restarts = 0
        self.fingerprint: dict | None = None
        self._starting: dict[int, Any] = {}  # actor slot -> its fingerprint ref, until ready

    def engine_fingerprint(self) -> dict:
        """The engines' fingerprint, once every engine has started; they must all agree."""
        try:
            prints = ray.get([a.fingerprint.remote() for a in self.actors])
        except RayTaskError as exc:
            raise _cause(exc) from None
        except RayActorError as exc:
            raise EngineError(f"an engine actor failed to start: {_first_line(exc)}") from None
        if any(fp != prints[0] for fp in prints):
            raise EngineError(
                "the engine actors report different fingerprints; a run needs identical engines"
            )
        self.fingerprint = prints[0]
        return prints[0]

    def _replace(self, i: int, exc: BaseException, what: str) -> None:
        self.restarts += 1
        if self.restarts > self._max_restarts:
            raise EngineError(
                f"engine actors died {self.restarts} times in this run (pool.max_actor_restarts "
                f"is {self._max_restarts}); last: {_first_line(exc)}"
            )
        print(f"[rollout] actor {i} died ({_first_line(exc)}); starting a new one, {what}",
              file=sys.stderr, flush=True)  # fmt: skip
        release_resource_group(self.actors[i]._actor_id.hex())
        self.actors[i] = self._cls.remote(*self._args)
        self._starting[i] = self.actors[i].fingerprint.remote()

    def _started(self, i: int, ref: Any) -> None:
        """A replacement's engine is up (or failed to start)."""
        del self._starting[i]
        try:
            fp = ray.get(ref)
        except RayTaskError as exc:
            raise _cause(exc) from None
        except RayActorError as exc:
            self._replace(i, exc, "as the last one failed to start")
            return
        if self.fingerprint is not None and fp != self.fingerprint:
            raise EngineError(
                f"a replacement engine actor reports another fingerprint than the run's: {fp}"
            )

    def run(
        self, tasks: Iterable[ShardTask], cancel: threading.Event | None = None
    ) -> Iterator[ShardResult]:
        queue = deque(tasks)
        attempts: Counter[int] = Counter()
        load = [0] * len(self.actors)
        inflight: dict[Any, tuple[int, Any, ShardTask]] = {}
        while queue or inflight:
            for i, actor in enumerate(self.actors):
                while queue and load[i] < self._in_flight and i not in self._starting:
                    task = queue.popleft()
                    inflight[actor.run.remote(task)] = (i, actor, task)
                    load[i] += 1
            starting = {ref: i for i, ref in self._starting.items()}
            ready, _ = ray.wait([*inflight, *starting], num_returns=1, timeout=0.25)
            if cancel is not None and cancel.is_set():
                raise JobCancelled("the job was cancelled")
            for ref in ready:
                if ref in starting:
                    self._started(starting[ref], ref)
                    continue
                i, actor, task = inflight.pop(ref)
                load[i] -= 1
                try:
                    result = ray.get(ref)
                except RayTaskError as exc:
                    raise _cause(exc) from None
                except RayActorError as exc:
                    attempts[task.shard_id] += 1
                    if attempts[task.shard_id] > self._max_retries:
                        raise EngineError(
                            f"shard {task.shard_id} (rows {task.start}..{task.end - 1}) lost its actor "
                            f"{attempts[task.shard_id]} times; last: {_first_line(exc)}"
                        ) from None
                    queue.appendleft(task)
                    if self.actors[i] is actor:  # replace each dead actor once
                        self._replace(i, exc, f"shard {task.shard_id} goes to the next free actor")
                    continue
                yield result

    def shutdown(self, timeout: float = 60.0) -> None:
        """Close every engine (freeing what it reserved), then end the actors."""
        closing = [a.close.remote() for a in self.actors]
        ray.wait(closing, num_returns=len(closing), timeout=timeout)
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
            release_resource_group(actor._actor_id.hex())


def _cause(exc: RayTaskError) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
