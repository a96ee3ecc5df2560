"""Fault injection for the fault suite (tests/faults), off unless ROLLOUT_FAULT is set.

ROLLOUT_FAULT="<point>:<shard_id>:<marker file>" makes the process that reaches that
point of that shard fail there, once: the marker file is created first, so the retry
(or the resumed run) passes the point normally. Several faults are separated by ";".
Points, in the order a shard meets them:

  before_first_row  the actor, before it reads the shard's rows       -> SIGKILL itself
  mid_generation    the engine, after its first generation step       -> SIGKILL itself
  during_write      the actor, Parquet written to its temporary name  -> SIGKILL itself
  after_write       the actor, shard file in place, result not sent   -> SIGKILL itself
  after_record      the driver, shard recorded in the journal         -> SIGKILLs the actor
  write_enospc      the actor, writing the shard                      -> OSError(ENOSPC)

ROLLOUT_FAULT_KILL=service kills the service (the Ray driver) instead, at the same
points: an actor that reaches an armed point SIGKILLs the driver and then itself (work
stops right there, as when the whole service dies), and the driver SIGKILLs itself
after recording. The driver's pid reaches the actors as ROLLOUT_FAULT_DRIVER_PID.

The checks cost one dictionary lookup when the variable is unset.
"""

from __future__ import annotations

import errno
import os
import signal
from pathlib import Path

ENV = "ROLLOUT_FAULT"
KILL_ENV = "ROLLOUT_FAULT_KILL"  # "actor" (default) or "service"
DRIVER_PID_ENV = "ROLLOUT_FAULT_DRIVER_PID"
POINTS = ("before_first_row", "mid_generation", "during_write", "after_write", "after_record",
          "write_enospc")  # fmt: skip
_current_shard: int | None = None


def set_shard(shard_id: int | None) -> None:
    """The shard this process is working on (for points reached inside the engine)."""
    global _current_shard
    _current_shard = shard_id


def _armed(point: str, shard_id: int | None) -> bool:
    spec = os.environ.get(ENV)
    if not spec:
        return False
    shard = _current_shard if shard_id is None else shard_id
    for entry in spec.split(";"):
        name, sid, marker = entry.split(":", 2)
        if name != point or shard is None or int(sid) != shard:
            continue
        try:  # once: whoever creates the marker fails, every later pass goes through
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        return True
    return False


def _kills_service() -> bool:
    return os.environ.get(KILL_ENV) == "service"


def point(name: str, shard_id: int | None = None) -> None:
    """This process reached `name`: die here if the fault is armed for it."""
    if _armed(name, shard_id):
        if name == "write_enospc":
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        if _kills_service():
            os.kill(int(os.environ[DRIVER_PID_ENV]), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


def after_record(shard_id: int, pid: int) -> None:
    """The driver recorded `shard_id`: kill the actor process that made it (or the
    driver itself, under ROLLOUT_FAULT_KILL=service), if armed."""
    if _armed("after_record", shard_id):
        os.kill(os.getpid() if _kills_service() else pid, signal.SIGKILL)


def env() -> dict[str, str]:
    """The fault variables for the actors, when the driver has them."""
    if not os.environ.get(ENV):
        return {}
    return {ENV: os.environ[ENV], KILL_ENV: os.environ.get(KILL_ENV, "actor"),
            DRIVER_PID_ENV: str(os.getpid())}  # fmt: skip


def fired(spec: str) -> list[str]:
    """The points of `spec` whose marker exists (they fired)."""
    return [e.split(":", 2)[0] for e in spec.split(";") if Path(e.split(":", 2)[2]).exists()]
