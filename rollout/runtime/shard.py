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

from rollout import determinism
from rollout.data.prompts import needed_columns, render_rows
from rollout.data.sink import RowBuffer, file_sha256, output_schema, write_atomic
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
    spec: JobSpec, source: Source, engine: Engine, task: ShardTask, out_dir: Path
) -> ShardResult:
    started = time.monotonic()
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
    meta: list[tuple[int, str, int, str]] = []  # (row_index, example_id, sample_index, prompt text)
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
            meta.append((row_index, example_id, sample, text))
    results = engine.generate(requests)
    carried = [table.schema.field(c) for c in spec.carry_columns]
    buffer = RowBuffer(
        output_schema(spec.sampling.logprobs, spec.sampling.top_logprobs > 0, carried)
    )
    hashes: list[str] = []
    prompt_tokens = output_tokens = 0
    last_row, prompt_hash = -1, None
    for (row_index, example_id, sample, text), result in zip(meta, results, strict=True):
        carried = None
        if spec.carry_columns:
            row = rows[row_index - task.start]
            carried = {f"input_{c}": row.get(c) for c in spec.carry_columns}
        if row_index != last_row:  # the n samples of a row share one prompt and its hash
            last_row, prompt_hash = row_index, determinism.token_hash(result.prompt_token_ids)
        top = None
        if result.top_logprobs is not None:
            top = [[{"token_id": t, "logprob": lp} for t, lp in pos] for pos in result.top_logprobs]
        hashes.append(
            buffer.add(
                row_index=row_index,
                example_id=example_id,
                sample_index=sample,
                seq_seed=requests[len(hashes)].seq_seed,
                prompt=text,
                prompt_token_ids=result.prompt_token_ids,
                prompt_hash=prompt_hash,
                output_text=result.output_text,
                output_token_ids=result.output_token_ids,
                output_logprobs=result.output_logprobs,
                top_logprobs=top,
                finish_reason=result.finish_reason,
                carried=carried,
            )
        )
        prompt_tokens += len(result.prompt_token_ids)
        output_tokens += len(result.output_token_ids)
    try:
        faults.point("write_enospc", task.shard_id)
        write_atomic(buffer.table(), out_dir / task.file_name)
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
        pid=os.getpid(),
        file_sha256=file_sha256(out_dir / task.file_name),
    )


def _skippable(problem: str) -> bool:
    return problem.endswith("is null") or problem == "the prompt is empty"
