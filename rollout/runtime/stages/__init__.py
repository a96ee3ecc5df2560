"""The shard worker as a chain of named stages, each a small module that reads what the
stages before it left on the ShardWork and adds its own part:

    read -> render -> tokenize -> generate -> score -> write

Each stage checks on entry that what it needs is there (StageError otherwise: a bug in
the chain, never a user's error), in the way Ray Data LLM builds its processors.
"""

from __future__ import annotations

from rollout.runtime.stages.base import ShardResult, ShardTask, ShardWork, Stage
from rollout.runtime.stages.generate import Generate
from rollout.runtime.stages.read import Read
from rollout.runtime.stages.render import Render
from rollout.runtime.stages.score import Score
from rollout.runtime.stages.tokenize import Tokenize
from rollout.runtime.stages.write import Write

STAGES: tuple[Stage, ...] = (Read(), Render(), Tokenize(), Generate(), Score(), Write())


def run_stages(work: ShardWork, stages: tuple[Stage, ...] = STAGES) -> ShardWork:
    for stage in stages:
        stage.check(work)
        stage.run(work)
    return work


__all__ = ["STAGES", "ShardResult", "ShardTask", "ShardWork", "Stage", "run_stages"]
