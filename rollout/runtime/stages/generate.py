"""generate: the engine's outputs for every request of the shard, in one call."""

from __future__ import annotations

from rollout.runtime.stages.base import ShardWork, Stage


class Generate(Stage):
    name = "generate"
    needs = ("samples",)

    def run(self, work: ShardWork) -> None:
        assert work.samples is not None
        work.generated = work.engine.generate_batch([s.request for s in work.samples])
