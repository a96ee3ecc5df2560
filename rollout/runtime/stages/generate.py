"""generate: the engine's outputs for every request of the shard, in one call; with a
generation cache, only for the requests it does not hold (rollout/cache/)."""

from __future__ import annotations

from rollout.engines.base import GenerationBatch
from rollout.runtime.stages.base import ShardWork, Stage, drop_samples, row_error


class Generate(Stage):
    name = "generate"
    needs = ("samples",)

    def run(self, work: ShardWork) -> None:
        """Generate; a request the engine rejects (RowError) is that row's error: with
        on_error skip it is left out and the rest generated again (batch invariance: their
        outputs are the same whatever else is in the batch)."""
        from rollout.errors import RowError

        while True:
            try:
                return self._generate(work)
            except RowError as exc:
                assert work.samples is not None
                at = next((i for i, s in enumerate(work.samples) if s.request.request_id == exc.request_id), None)  # fmt: skip
                if at is None:
                    raise
                s = work.samples[at]
                row_error(work, "generate", f"input row {s.row_index} sample {s.sample_index}", s.row_index,
                          s.example_id, f"{exc.detail} (finish reason {exc.reason!r})", s.sample_index)  # fmt: skip
                drop_samples(work, {at})

    def _generate(self, work: ShardWork) -> None:
        assert work.samples is not None
        requests = [s.request for s in work.samples]
        cache = work.cache
        if cache is None:
            work.generated = work.engine.generate_batch(requests)
            return
        from rollout.cache import row_key

        keys = [row_key(work.cache_engine_key, r, work.task.determinism) for r in requests]
        results = cache.get(keys, [r.request_id for r in requests])
        missing = [i for i in range(len(requests)) if i not in results]
        if missing:
            fresh = work.engine.generate_batch([requests[i] for i in missing]).results()
            for i, result in zip(missing, fresh, strict=True):
                results[i] = result
            cache.put([keys[i] for i in missing], fresh)
        work.rows_cached = len(requests) - len(missing)
        fresh_ids = set(missing)
        work.tokens_cached = sum(len(results[i].output_token_ids) for i in results if i not in fresh_ids)  # fmt: skip
        work.generated = GenerationBatch.from_results([results[i] for i in range(len(requests))])
