"""One shard, end to end, inside an engine actor: the chain of stages in
rollout/runtime/stages/ (read -> render -> tokenize -> generate -> score -> write).

The shard's rows are bounded by the shard size, so a shard is handled in memory; the
dataset as a whole never is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout.data.sources import Source
from rollout.engines.base import Engine
from rollout.jobs.spec import JobSpec
from rollout.runtime.stages import ShardResult, ShardTask, ShardWork, run_stages
from rollout.runtime.stages.render import example_id_of

__all__ = ["ShardResult", "ShardTask", "example_id_of", "run_shard"]


def run_shard(
    spec: JobSpec, source: Source, engine: Engine, task: ShardTask, out_dir: Path,
    roots: tuple[str, ...] = (), scorers: list[Any] | None = None, cache: Any = None,
    cache_engine_key: str = "",
) -> ShardResult:  # fmt: skip
    """Run the shard `task` of the job through every stage; what it wrote."""
    work = run_stages(ShardWork(spec, task, source, engine, out_dir, roots, scorers, cache,
                                cache_engine_key))  # fmt: skip
    assert work.result is not None
    return work.result
