"""The actor pool: hands shards to idle actors, retries shards whose actor died.

The driver keeps only what is in flight (a few shards per actor). A dead actor
(`RayActorError`) is replaced by a new one, and its shards go back to the front of the
queue, to run on whichever actor is free next, up to `max_shard_retries` times each.
An error raised by the work itself (bad input, an engine error) is not retried: it
stops the job with that error.
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
from rollout.runtime.actor import EngineWorker, actor_env
from rollout.runtime.shard import ShardResult, ShardTask


class ShardPool:
    def __init__(
        self,
        size: int,
        actor_args: tuple,
        num_cpus: float,
        num_gpus: float,
        in_flight_per_actor: int,
        max_retries: int,
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
        self.actors: list[Any] = [self._cls.remote(*self._args) for _ in range(size)]
        self.restarts = 0

    def fingerprints(self) -> list[dict]:
        """Each actor's engine fingerprint, once every engine has started."""
        try:
            return ray.get([a.fingerprint.remote() for a in self.actors])
        except RayTaskError as exc:
            raise _cause(exc) from None
        except RayActorError as exc:
            raise EngineError(f"an engine actor failed to start: {_first_line(exc)}") from None

    def run(
        self, tasks: Iterable[ShardTask], cancel: threading.Event | None = None
    ) -> Iterator[ShardResult]:
        queue = deque(tasks)
        attempts: Counter[int] = Counter()
        load = [0] * len(self.actors)
        inflight: dict[Any, tuple[int, Any, ShardTask]] = {}
        while queue or inflight:
            for i, actor in enumerate(self.actors):
                while queue and load[i] < self._in_flight:
                    task = queue.popleft()
                    inflight[actor.run.remote(task)] = (i, actor, task)
                    load[i] += 1
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.25)
            if cancel is not None and cancel.is_set():
                raise JobCancelled("the job was cancelled")
            for ref in ready:
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
                        print(
                            f"[rollout] actor {i} died ({_first_line(exc)}); restarting it, "
                            f"shard {task.shard_id} goes to the next free actor",
                            file=sys.stderr,
                            flush=True,
                        )
                        self.actors[i] = self._cls.remote(*self._args)
                        self.restarts += 1
                    continue
                yield result

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)


def _cause(exc: RayTaskError) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
