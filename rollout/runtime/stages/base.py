"""What the stages share: the task, the work they build up, and the stage interface."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from rollout import determinism
from rollout.data.sources import Source
from rollout.engines.base import Engine, GenerationBatch, GenerationRequest
from rollout.jobs.spec import JobSpec


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
    rows_cached: int = 0  # rows served from the generation cache instead of the engine
    tokens_cached: int = 0  # their output tokens


@dataclass
class Sample:
    """One output row to be: its keys, its prompt text and the request that makes it."""

    row_index: int
    example_id: str
    sample_index: int
    prompt_text: str | None
    request: GenerationRequest
    row: dict[str, Any]  # the input row's columns
    request_params: str | None = None  # openai-batch: the parameters this row was made with


@dataclass
class ShardWork:
    """One shard on its way through the stages."""

    spec: JobSpec
    task: ShardTask
    source: Source
    engine: Engine
    out_dir: Path
    roots: tuple[str, ...] = ()
    scorers: list[Any] | None = None  # built once per actor; None: built by the score stage
    cache: Any = None  # the generation cache (rollout.cache.GenerationCache), if the job has one
    cache_engine_key: str = ""  # rollout.cache.store.engine_key of the engine's fingerprint
    rows_cached: int = 0
    tokens_cached: int = 0
    # read
    table: pa.Table | None = None
    rows: list[dict[str, Any]] | None = None
    # render: per input row, its prompt text (None: not wanted, or skipped)
    texts: list[str | None] | None = None
    skipped: list[dict] = field(default_factory=list)
    # tokenize
    samples: list[Sample] | None = None
    # generate
    generated: GenerationBatch | None = None
    # score: column name -> values, in sample order
    scores: dict[str, pa.Array] | None = None
    # write
    result: ShardResult | None = None
    started: float = 0.0
    cpu_started: float = 0.0


def row_error(work: ShardWork, stage: str, where: str, row_index: int, example_id: str,
              reason: str, sample_index: int | None = None) -> None:  # fmt: skip
    """One row's error: with on_error skip, the row is listed in errors.jsonl (its example
    id, stage and reason) and the job goes on; else the job stops naming the example."""
    from rollout.errors import InputError

    if work.spec.on_error != "skip":
        raise InputError(f"{where} (example {example_id!r})", reason)
    entry = {"row_index": row_index, "example_id": example_id, "stage": stage, "reason": reason}
    if sample_index is not None:
        entry["sample_index"] = sample_index
    work.skipped.append(entry)


def drop_samples(work: ShardWork, drop: set[int]) -> None:
    """Leave the samples at positions `drop` out (and their generations, when made)."""
    from rollout.engines.base import GenerationBatch

    assert work.samples is not None
    keep = [i for i in range(len(work.samples)) if i not in drop]
    if work.generated is not None:
        results = work.generated.results()
        work.generated = GenerationBatch.from_results([results[i] for i in keep])
    work.samples = [work.samples[i] for i in keep]


class StageError(AssertionError):
    """A stage ran without what the stages before it should have left: a bug in the chain."""


class Stage:
    """One step of the shard worker: `needs` names the ShardWork fields it reads."""

    name: ClassVar[str] = ""
    needs: ClassVar[tuple[str, ...]] = ()

    def check(self, work: ShardWork) -> None:
        missing = [n for n in self.needs if getattr(work, n) is None]
        if missing:
            raise StageError(f"stage {self.name!r} needs {', '.join(missing)}, which no earlier stage made")  # fmt: skip

    def run(self, work: ShardWork) -> None:
        raise NotImplementedError
