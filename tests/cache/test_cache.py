"""The generation cache: a stale hit is the worst bug it can have, so every field that
decides a row's output is changed here and must miss; what does not decide it must hit;
and jobs with a cache write exactly the rows (and digests) that jobs without one write."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from rollout.cache import GenerationCache, row_key
from rollout.cache.store import check_cacheable, engine_key
from rollout.engines import create_engine
from rollout.engines.base import GenerationRequest
from rollout.errors import ConfigError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner
from rollout.sampling_params import SamplingParams

BASE = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=16, logprobs=True)


def request(**over) -> GenerationRequest:
    fields = {"request_id": "0:0", "prompt_token_ids": [5, 6, 7], "params": BASE, "seq_seed": 42}
    return GenerationRequest(**(fields | over))


def key(req: GenerationRequest, fingerprint: dict | None = None, version: str = "v2") -> str:
    return row_key(
        engine_key(fingerprint or {"engine": "synthetic", "vocab_size": 32000}), req, version
    )


def test_every_field_that_decides_the_output_changes_the_key():
    base = key(request())
    variants = {
        "engine fingerprint": key(request(), {"engine": "synthetic", "vocab_size": 32001}),
        "engine": key(request(), {"engine": "smollm2", "vocab_size": 32000}),
        "a prompt token": key(request(prompt_token_ids=[5, 6, 8])),
        "a longer prompt": key(request(prompt_token_ids=[5, 6, 7, 0])),
        "seq_seed": key(request(seq_seed=43)),
        "determinism contract": key(request(), version="v1"),
        "teacher-forced completion": key(request(forced_output=[1, 2])),
        "another completion": key(request(forced_output=[1, 3])),
    }
    for field, value in {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "max_tokens": 17,
                         "logprobs": False, "top_logprobs": 2, "stop": ["x"],
                         "stop_token_ids": [3], "ignore_eos": True,
                         "truncate_prompt_tokens": 2, "include_stop_str_in_output": True}.items():  # fmt: skip
        variants[f"sampling.{field}"] = key(request(params=BASE.model_copy(update={field: value})))
    for name, k in variants.items():
        assert k != base, f"changing {name} did not change the key"
    assert len(set(variants.values())) == len(variants)
    # what does not decide the output: the request id (row position) does not change the key
    assert key(request(request_id="9:3")) == base
    # every SamplingParams field is covered: a new one must be added to this test
    covered = {"temperature", "top_p", "top_k", "max_tokens", "logprobs", "top_logprobs", "stop",
               "stop_token_ids", "ignore_eos", "truncate_prompt_tokens", "so_args",
               "include_stop_str_in_output"}  # fmt: skip
    assert set(SamplingParams.model_fields) - covered == set(), "a sampling field is not tested"


def test_a_structured_output_schema_changes_the_key():
    base = BASE.model_dump(exclude={"so_args"})
    a = SamplingParams(**base, so_args={"schema_type": "json", "schema": '{"type": "object"}'})
    b = SamplingParams(**base, so_args={"schema_type": "json", "schema": '{"type": "array"}'})
    assert len({key(request()), key(request(params=a)), key(request(params=b))}) == 3


def test_hits_return_what_the_engine_made(tmp_path):
    engine = create_engine("synthetic")
    engine.start()
    ek = engine_key(engine.fingerprint())
    reqs = [request(seq_seed=s, request_id=f"0:{s}", params=BASE.model_copy(update={"top_logprobs": 2}))
            for s in range(6)]  # fmt: skip
    made = engine.generate(reqs)
    cache = GenerationCache(tmp_path / "c")
    keys = [row_key(ek, r, "v2") for r in reqs]
    assert cache.put(keys[:4], made[:4]) == 4
    assert cache.put(keys[:4], made[:4]) == 0  # already there: nothing added
    got = cache.get(keys, [f"x{i}" for i in range(6)])
    assert sorted(got) == [0, 1, 2, 3]
    for i in range(4):
        assert got[i].request_id == f"x{i}"
        for field in ("prompt_token_ids", "output_token_ids", "output_text", "finish_reason"):
            assert getattr(got[i], field) == getattr(made[i], field), field
        # logprobs are float32 in every output file: the cache keeps those bits
        f32 = lambda xs: np.asarray(xs, dtype=np.float32).view(np.uint32).tolist()  # noqa: E731
        assert f32(got[i].output_logprobs) == f32(made[i].output_logprobs)
        assert [[t for t, _ in p] for p in got[i].top_logprobs] == [[t for t, _ in p] for p in made[i].top_logprobs]  # fmt: skip
        assert [f32([lp for _, lp in p]) for p in got[i].top_logprobs] == [f32([lp for _, lp in p]) for p in made[i].top_logprobs]  # fmt: skip
    assert cache.stats()["rows"] == 4
    cache.close()


def test_gc_removes_orphans_and_old_segments(tmp_path):
    cache = GenerationCache(tmp_path / "c")
    engine = create_engine("synthetic")
    engine.start()
    ek = engine_key(engine.fingerprint())
    reqs = [request(seq_seed=s) for s in range(3)]
    cache.put([row_key(ek, r, "v2") for r in reqs], engine.generate(reqs))
    orphan = tmp_path / "c" / "segments" / "orphan.parquet"
    orphan.write_bytes(b"x")
    import os

    os.utime(orphan, (0, 0))  # old enough not to be a write in flight
    assert cache.gc() == {"segments_removed": 1, "rows_removed": 0}
    assert cache.stats()["rows"] == 3
    assert cache.gc(max_bytes=0) == {"segments_removed": 1, "rows_removed": 3}
    assert cache.stats()["rows"] == 0 and cache.get([row_key(ek, reqs[0], "v2")], ["a"]) == {}
    cache.close()


def test_an_engine_without_batch_invariance_cannot_be_cached():
    with pytest.raises(ConfigError, match="batch_invariant: false.*cannot be cached"):
        check_cacheable({"engine": "smollm2", "batch_invariant": False})
    check_cacheable({"engine": "smollm2", "batch_invariant": True})


def spec(inp: Path, out: Path, cache: Path | None, **over) -> dict:
    return {"input": {"path": str(inp)}, "prompt": {"column": "q"}, "n": 4, "job_seed": 3,
            "sampling": {"temperature": 1.0, "max_tokens": 12, "logprobs": True},
            "engine": {"name": "synthetic"}, "shard_size": 3, "output": str(out),
            "pool": {"actors": 2, "cpus_per_actor": 0.5},
            "cache": None if cache is None else str(cache)} | over  # fmt: skip


def test_jobs_with_a_cache_write_the_rows_jobs_without_one_write(ray_runtime, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"q": f"question {i}"}) + "\n" for i in range(7)))
    cache = tmp_path / "cache"
    plain = JobRunner(parse_job_spec(spec(inp, tmp_path / "plain", None))).run()
    first = JobRunner(parse_job_spec(spec(inp, tmp_path / "a", cache))).run()
    again = JobRunner(parse_job_spec(spec(inp, tmp_path / "b", cache, shard_size=2))).run()
    assert (first.rows_generated, first.rows_cached) == (28, 0)
    assert (again.rows_generated, again.rows_cached) == (0, 28)  # a repeated cell costs nothing
    assert plain.run_digest == first.run_digest == again.run_digest
    more = JobRunner(parse_job_spec(spec(inp, tmp_path / "n8", cache, n=8))).run()
    assert (more.rows_generated, more.rows_cached) == (28, 28)  # only samples 4 to 7
    plain8 = JobRunner(parse_job_spec(spec(inp, tmp_path / "plain8", None, n=8))).run()
    assert more.run_digest == plain8.run_digest
    # anything that decides the output misses: another temperature, job seed or max_tokens
    for i, over in enumerate(({"job_seed": 4}, {"sampling": {"temperature": 0.5, "max_tokens": 12, "logprobs": True}},
                              {"sampling": {"temperature": 1.0, "max_tokens": 11, "logprobs": True}})):  # fmt: skip
        other = JobRunner(parse_job_spec(spec(inp, tmp_path / f"o{i}", cache, **over))).run()
        assert (other.rows_generated, other.rows_cached) == (28, 0), over
    stats = json.loads((tmp_path / "n8" / "stats.json").read_text())
    assert (stats["rows_generated"], stats["rows_cached"]) == (28, 28)
    with sqlite3.connect(cache / "index.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM rows").fetchone()[0] == 56 + 3 * 28
