"""tokenize: each wanted row's prompt token ids, and one request per sample (its seq_seed,
and under teacher forcing the completion it is given)."""

from __future__ import annotations

import json
from typing import Any

from rollout import determinism
from rollout.data.openai_batch import row_sampling
from rollout.engines import STRUCTURED_OUTPUT
from rollout.engines.base import GenerationRequest
from rollout.errors import InputError
from rollout.runtime.stages.base import Sample, ShardWork, Stage, row_error
from rollout.runtime.stages.render import example_id_of


def _ids(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) for t in value):
        raise InputError(where, f"must be a list of token ids, got {type(value).__name__}")
    return value


class Tokenize(Stage):
    name = "tokenize"
    needs = ("rows", "texts")

    def run(self, work: ShardWork) -> None:
        spec, task, engine = work.spec, work.task, work.engine
        assert work.rows is not None and work.texts is not None
        tf = spec.teacher_forcing
        wanted = None if task.samples is None else set(task.samples)
        wanted_rows = None if wanted is None else {r for r, _ in wanted}
        skipped = {s["row_index"] for s in work.skipped}
        samples: list[Sample] = []
        for offset, (row, text) in enumerate(zip(work.rows, work.texts, strict=True)):
            row_index = task.start + offset
            if (wanted_rows is not None and row_index not in wanted_rows) or row_index in skipped:
                continue
            example_id = example_id_of(row, spec.id_column, row_index)
            where = f"input row {row_index}"
            named = f"{where} (example {example_id!r})"
            if tf is not None and tf.prompt_ids_column:
                ids = _ids(row.get(tf.prompt_ids_column), f"{named}: column {tf.prompt_ids_column!r}")  # fmt: skip
            else:
                assert text is not None
                ids = engine.encode(text)
            forced = None
            if tf is not None:
                if tf.completion_ids_column:
                    forced = _ids(row.get(tf.completion_ids_column), f"{named}: column {tf.completion_ids_column!r}")  # fmt: skip
                else:
                    completion = row.get(tf.completion_column)
                    if not isinstance(completion, str):
                        raise InputError(named, f"column {tf.completion_column!r} must hold the completion's text, got {type(completion).__name__}")  # fmt: skip
                    forced = engine.encode_continuation(completion)
            params, n, job_seed, request_params = spec.sampling, spec.n, spec.job_seed, None
            if spec.input.format == "openai-batch":
                try:
                    params, n, job_seed = row_sampling(row, spec.sampling, spec.job_seed, spec.n, where)  # fmt: skip
                except InputError as exc:
                    row_error(work, "tokenize", exc.where, row_index, example_id, exc.reason)
                    continue
                request_params = json.dumps({"model": row.get("model"), "url": row.get("url"), "n": n, "seed": str(job_seed)} | params.config_view(), sort_keys=True)  # fmt: skip
                if params.so_args is not None and spec.engine.name not in STRUCTURED_OUTPUT:
                    row_error(work, "tokenize", f"{where}: body.response_format", row_index, example_id,
                              f"structured output needs an engine that supports it ({', '.join(sorted(STRUCTURED_OUTPUT))})")  # fmt: skip
                    continue
            if not ids:
                row_error(work, "tokenize", where, row_index, example_id, "the prompt is empty (0 tokens)")  # fmt: skip
                continue
            room = engine.max_model_len
            fed = len(ids) if params.truncate_prompt_tokens is None else min(len(ids), params.truncate_prompt_tokens)  # fmt: skip
            if fed >= room:
                row_error(work, "tokenize", where, row_index, example_id,
                          f"the prompt has {fed} tokens, which leaves no room in the context of {room} tokens (max_model_len); shorten it or set sampling.truncate_prompt_tokens")  # fmt: skip
                continue
            for sample in range(n):
                if wanted is not None and (row_index, sample) not in wanted:
                    continue
                seed = determinism.seq_seed(job_seed, example_id, sample)
                request = GenerationRequest(f"{row_index}:{sample}", ids, params, seed, forced)
                samples.append(Sample(row_index, example_id, sample, text, request, row, request_params))  # fmt: skip
        work.samples = samples
