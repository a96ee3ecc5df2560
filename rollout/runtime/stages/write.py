"""write: the shard's output table (hashes per the determinism contract, score columns
after the rest) written atomically under the run's folder, and the shard's result."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.compute as pc

from rollout import determinism
from rollout.data.confined import confined_dir
from rollout.data.sink import ShardRows, file_sha256, output_schema, shard_table, write_atomic
from rollout.errors import OutputError
from rollout.runtime import faults
from rollout.runtime.stages.base import ShardResult, ShardWork, Stage


class Write(Stage):
    name = "write"
    needs = ("table", "samples", "generated", "scores")

    def run(self, work: ShardWork) -> None:
        spec, task = work.spec, work.task
        table, samples, generated, scores = work.table, work.samples, work.generated, work.scores
        assert table is not None and samples is not None and generated is not None and scores is not None  # fmt: skip
        picked = pa.array([s.row_index - task.start for s in samples], pa.int64())
        carried = {f"input_{c}": table.column(c).take(picked) for c in spec.carry_columns}
        per_row = spec.input.format == "openai-batch"  # rows ask for logprobs themselves
        schema = output_schema(
            spec.sampling.logprobs or per_row,
            spec.sampling.top_logprobs > 0 or per_row,
            [table.schema.field(c) for c in spec.carry_columns],
        )
        out_table, hashes = shard_table(
            schema,
            task.determinism,
            ShardRows(
                row_index=[s.row_index for s in samples],
                example_id=[s.example_id for s in samples],
                sample_index=[s.sample_index for s in samples],
                seq_seed=[s.request.seq_seed for s in samples],
                prompt=[s.prompt_text for s in samples],
                generated=generated,
                carried=carried,
            ),
        )
        if any(s.request_params is not None for s in samples):  # openai-batch: each row's own
            params = pa.array([s.request_params for s in samples], pa.string())
            out_table = out_table.append_column(pa.field("request_params", pa.string()), params)
        for name, column in scores.items():
            out_table = out_table.append_column(pa.field(name, column.type), column)
        prompt_tokens = int(pc.sum(out_table.column("num_prompt_tokens")).as_py() or 0)
        output_tokens = int(pc.sum(out_table.column("num_output_tokens")).as_py() or 0)
        try:
            faults.point("write_enospc", task.shard_id)
            with confined_dir("output", str(work.out_dir), work.roots) as folder:
                write_atomic(out_table, folder / task.file_name)
                sha = file_sha256(folder / task.file_name)
        except OSError as exc:
            raise OutputError(
                f"output {work.out_dir}", f"shard {task.shard_id} could not be written: {exc}"
            ) from None
        faults.point("after_write", task.shard_id)
        work.result = ShardResult(
            shard_id=task.shard_id,
            start=task.start,
            end=task.end,
            file=task.file_name,
            rows=len(hashes),
            shard_digest=determinism.shard_digest(hashes),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            seconds=time.monotonic() - work.started,
            skipped=list(work.skipped),
            cpu_seconds=time.process_time() - work.cpu_started,
            pid=os.getpid(),
            file_sha256=sha,
            rows_cached=work.rows_cached,
            tokens_cached=work.tokens_cached,
        )
