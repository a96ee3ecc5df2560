"""read: the shard's input rows, as a table and as Python rows."""

from __future__ import annotations

import time

import pyarrow as pa

from rollout.data.prompts import needed_columns
from rollout.errors import InputError
from rollout.runtime import faults
from rollout.runtime.stages.base import ShardWork, Stage


class Read(Stage):
    name = "read"

    def run(self, work: ShardWork) -> None:
        spec, task = work.spec, work.task
        work.started, work.cpu_started = time.monotonic(), time.process_time()
        faults.set_shard(task.shard_id)
        faults.point("before_first_row", task.shard_id)
        batches = list(work.source.read(task.start, task.end, needed_columns(spec)))
        table = pa.Table.from_batches(batches)
        if table.num_rows != task.end - task.start:
            raise InputError(
                f"input {spec.input.path!r}",
                f"rows {task.start}..{task.end - 1} could not all be read (got {table.num_rows}): did the input change?",
            )
        try:
            rows = table.to_pylist()
        except UnicodeDecodeError as exc:  # a text column holding bytes that are not UTF-8
            raise InputError(
                f"input {spec.input.path!r}",
                f"rows {task.start}..{task.end - 1} hold text that is not UTF-8: byte "
                f"0x{exc.object[exc.start]:02x} cannot be decoded ({exc.reason})",
            ) from None
        work.table, work.rows = table, rows
