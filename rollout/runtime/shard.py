"""One shard, end to end, inside an engine actor: read rows -> prompts -> generate -> hash -> Parquet.

The shard's rows are bounded by the shard size, so a shard is handled in memory; the
dataset as a whole never is.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from rollout import determinism
from rollout.data.confined import confined_dir
from rollout.data.prompts import needed_columns, render_rows
from rollout.data.sink import ShardRows, file_sha256, output_schema, shard_table, write_atomic
from rollout.data.sources import Source
from rollout.engines.base import Engine, GenerationRequest
from rollout.errors import InputError, OutputError
from rollout.jobs.spec import JobSpec
from rollout.runtime import faults


@dataclass(frozen=True)
class ShardTask:
    shard_id: int
    start: int  # first input row (row_index)
    end: int  # one past the last input row
    # Only these (row_index, sample_index) pairs, for re-checking a sample of a run
    # (`rollout verify`); None: every row and sample of the range.
    samples: tuple[tuple[int, int], ...] | None = None
    # the determinism contract of the run's row hashes (a resumed v1 run stays v1)
    determinism: str = determinism.CURRENT_VERSION

    @property
    def file_name(self) -> str:
        return f"part-{self.shard_id:06d}.parquet"


@dataclass
class ShardResult:
    shard_id: int
    start: int
    end: int
    file: str
    rows: int
    shard_digest: str
    prompt_tokens: int
    output_tokens: int
    seconds: float
    skipped: list[dict] = field(default_factory=list)
    cpu_seconds: float = 0.0  # CPU time of the process that made it (all its threads)
    pid: int = 0  # the process that made it
    file_sha256: str = ""


def example_id_of(row: dict, id_column: str | None, row_index: int) -> str:
    if id_column is None:
        return str(row_index)
    value = row.get(id_column)
    if value is None:
        raise InputError(f"row {row_index}", f"id column {id_column!r} is null")
    return value if isinstance(value, str) else str(value)


def run_shard(
    spec: JobSpec, source: Source, engine: Engine, task: ShardTask, out_dir: Path,
    roots: tuple[str, ...] = (),
) -> ShardResult:  # fmt: skip
    started, cpu_started = time.monotonic(), time.process_time()
    faults.set_shard(task.shard_id)
    faults.point("before_first_row", task.shard_id)
    table = pa.Table.from_batches(list(source.read(task.start, task.end, needed_columns(spec))))
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
    rendered = render_rows(rows, spec.prompt)
    skipped: list[dict] = []
    requests: list[GenerationRequest] = []
    # per request: its row, example id, sample and prompt text (the output's key columns)
    row_indices: list[int] = []
    example_ids: list[str] = []
    sample_indices: list[int] = []
    texts: list[str] = []
    wanted = None if task.samples is None else set(task.samples)
    wanted_rows = None if wanted is None else {r for r, _ in wanted}
    for offset, (row, prompt) in enumerate(zip(rows, rendered, strict=True)):
        row_index = task.start + offset
        if wanted_rows is not None and row_index not in wanted_rows:
            continue
        example_id = example_id_of(row, spec.id_column, row_index)
        if prompt.problem is not None:
            if spec.prompt.on_empty == "skip" and _skippable(prompt.problem):
                skipped.append(
                    {"row_index": row_index, "example_id": example_id, "reason": prompt.problem}
                )
                continue
            raise InputError(f"input row {row_index} (example {example_id!r})", prompt.problem)
        text = (
            engine.apply_chat_template(prompt.messages)
            if prompt.messages is not None
            else prompt.text
        )
        assert text is not None
        ids = engine.encode(text)
        for sample in range(spec.n):
            if wanted is not None and (row_index, sample) not in wanted:
                continue
            seed = determinism.seq_seed(spec.job_seed, example_id, sample)
            requests.append(GenerationRequest(f"{row_index}:{sample}", ids, spec.sampling, seed))
            row_indices.append(row_index)
            example_ids.append(example_id)
            sample_indices.append(sample)
            texts.append(text)
    generated = engine.generate_batch(requests)
    picked = pa.array([row_index - task.start for row_index in row_indices], pa.int64())
    carried = {f"input_{c}": table.column(c).take(picked) for c in spec.carry_columns}
    schema = output_schema(
        spec.sampling.logprobs,
        spec.sampling.top_logprobs > 0,
        [table.schema.field(c) for c in spec.carry_columns],
    )
    out_table, hashes = shard_table(
        schema,
        task.determinism,
        ShardRows(
            row_index=row_indices,
            example_id=example_ids,
            sample_index=sample_indices,
            seq_seed=[r.seq_seed for r in requests],
            prompt=texts,
            generated=generated,
            carried=carried,
        ),
    )
    prompt_tokens = int(pc.sum(out_table.column("num_prompt_tokens")).as_py() or 0)
    output_tokens = int(pc.sum(out_table.column("num_output_tokens")).as_py() or 0)
    try:
        faults.point("write_enospc", task.shard_id)
        with confined_dir("output", str(out_dir), roots) as folder:
            write_atomic(out_table, folder / task.file_name)
            sha = file_sha256(folder / task.file_name)
    except OSError as exc:
        raise OutputError(
            f"output {out_dir}", f"shard {task.shard_id} could not be written: {exc}"
        ) from None
    faults.point("after_write", task.shard_id)
    return ShardResult(
        shard_id=task.shard_id,
        start=task.start,
        end=task.end,
        file=task.file_name,
        rows=len(hashes),
        shard_digest=determinism.shard_digest(hashes),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        seconds=time.monotonic() - started,
        skipped=skipped,
        cpu_seconds=time.process_time() - cpu_started,
        pid=os.getpid(),
        file_sha256=sha,
    )


def _skippable(problem: str) -> bool:
    return problem.endswith("is null") or problem == "the prompt is empty"
