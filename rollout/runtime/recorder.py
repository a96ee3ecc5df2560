"""The driver's store for a running job: finished shards recorded as they arrive.

Each batch of shards that finished together is one fsynced append to the journal
(`shards.jsonl`); only then are they part of the run. `manifest.json` is snapshotted at
most every SNAPSHOT_EVERY_S, and on any stop (the journal keeps what a snapshot missed).
The same code records a real job (JobRunner) and the simulated cluster's (simulate.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rollout.errors import OutputError
from rollout.runtime import faults
from rollout.runtime.manifest import Manifest
from rollout.runtime.shard import ShardResult

log = logging.getLogger(__name__)

SNAPSHOT_EVERY_S = 5.0  # manifest.json rewritten at most this often; shards.jsonl in between


@contextlib.contextmanager
def writing(out: Path, what: str) -> Iterator[None]:
    """The driver's writes to the run directory: a full or read-only filesystem is the
    output's fault, said as such (OutputError), never an internal error."""
    try:
        yield
    except OSError as exc:
        raise OutputError(f"output {out}", f"{what}: {exc}") from None


def record_batches(
    out: Path,
    manifest: Manifest,
    batches: Iterable[list[ShardResult]],
    on_result: Callable[[ShardResult], None],
    label: Path | None = None,
) -> None:
    """Record every batch of finished shards of `batches` into `manifest` and its journal
    in `out`; `on_result` sees each shard once it is recorded; messages name `label`
    (default `out`)."""
    named = label or out
    by_id = {s.shard_id: s for s in manifest.shards}
    snapshot_at = time.monotonic()
    try:
        for batch in batches:
            with writing(named, f"shards {[r.shard_id for r in batch]} could not be recorded"):
                Manifest.record(out, batch)  # durable: one append per batch
            for result in batch:  # recorded: now part of the run
                by_id[result.shard_id].mark_complete(result)
                faults.after_record(result.shard_id, result.pid)
            if time.monotonic() - snapshot_at >= SNAPSHOT_EVERY_S:
                with writing(named, "the manifest snapshot could not be written"):
                    manifest.save(out)
                snapshot_at = time.monotonic()
            for result in batch:
                on_result(result)
    except BaseException:
        try:  # stopped or failed: the snapshot holds what was recorded
            manifest.save(out)
        except OSError as exc:  # the output is full or read-only: the journal still is
            log.error("the manifest snapshot could not be written (%s); shards.jsonl keeps what was recorded", exc)  # fmt: skip
        raise
