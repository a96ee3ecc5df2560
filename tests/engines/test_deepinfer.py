"""The DeepInfer engine against its API contract (tests/fakes/deepinfer), in a real Ray runtime.

A replica here has 2 ranks without GPUs (the layout is a config); on a B300 node it has 8
with one GPU each. The real-hardware canary at the end runs only where deepinfer and
SM100 GPUs are present.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout import determinism
from rollout.engines import GenerationRequest, create_engine
from rollout.engines.deepinfer import (
    PINNED_DEFAULTS,
    SWITCHES,
    DeepInferOptions,
    deepinfer_env,
    preflight,
    rank_env,
)
from rollout.engines.deepinfer_replica import split
from rollout.errors import ConfigError, EngineError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner
from rollout.sampling_params import SamplingParams
from tests.conftest import FAKES
from tests.runtime.conftest import independent_run_digest

RANKS = 2
PINNED = SWITCHES | PINNED_DEFAULTS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A model directory: a real tokenizer (SmolLM2's) and a config, no weights."""

    from rollout.engines.smollm2.weights import ensure_cached

    d = tmp_path_factory.mktemp("deepseek-v41-flash")
    src = ensure_cached().path
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / name).exists():
            shutil.copy(src / name, d / name)
    # DeepSeek's ids: BOS 0, EOS 1 (the stand-in's tokenizer inserts BOS 0 as DeepInfer's does)
    config = {"_name_or_path": "deepseek-ai/DeepSeek-V4.1-Flash-1017", "vocab_size": 49152,
              "eos_token_id": 1, "bos_token_id": 0}  # fmt: skip
    (d / "config.json").write_text(json.dumps(config))
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    return d


def options(model_dir: Path, **over) -> dict:
    return {"model": str(model_dir), "engines_per_replica": RANKS, "gpus_per_engine": 0,
            "cpus_per_engine": 0.25, "max_model_len": 4096, "max_num_seqs": 64, **over}  # fmt: skip


def calls(model_dir: Path) -> list[dict]:
    path = model_dir / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def fresh_log(model_dir):
    (model_dir / "calls.jsonl").unlink(missing_ok=True)
    return model_dir


def requests(n: int, **params) -> list[GenerationRequest]:
    sp = SamplingParams(temperature=0.8, max_tokens=12, logprobs=True, **params)
    return [GenerationRequest(str(i), [1 + i, 2, 3 + i], sp, determinism.seq_seed(7, str(i), 0))
            for i in range(n)]  # fmt: skip


def test_split_covers_every_request_once():
    for n in range(0, 20):
        for ranks in (1, 2, 3, 8):
            parts = split(n, ranks)
            assert len(parts) == ranks and sorted(i for p in parts for i in p) == list(range(n))


def test_replica_ranks_get_switches_layout_and_own_devices(ray_runtime, fresh_log):
    engine = create_engine("deepinfer", **options(fresh_log, eplb_step_interval=None))
    engine.start()
    try:
        fp = engine.fingerprint()
        results = engine.generate(requests(5))
    finally:
        engine.close()
    inits = [c for c in calls(fresh_log) if c["event"] == "init"]
    assert sorted(c["rank"] for c in inits) == list(range(RANKS))
    for c in inits:
        env = c["import_env"]  # what the process held when deepinfer was imported
        # every variable that decides outputs, set explicitly (never inherited)
        assert {k: env[k] for k in PINNED} == PINNED
        assert env["DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL"] == "0"  # EPLB off
        assert env["DEEPINFER_USE_NEXTN_DECODE"] == "5"  # speculative decoding pinned
        assert env["DEEPINFER_USE_MULTIMODAL_POOL"] == "0"
        args = c["engine_args"]
        assert args["data_parallel_size"] == RANKS and c["expert_parallel_size"] == RANKS
        assert args["engine_rank"] == c["rank"] and c["decode_sequence"] is False
        assert args["max_num_seqs"] == 64 and args["max_model_len"] == 4096
    assert len({c["import_env"]["CUDA_VISIBLE_DEVICES"] for c in inits}) == RANKS
    assert (
        len({(c["import_env"]["MASTER_ADDR"], c["import_env"]["MASTER_PORT"]) for c in inits}) == 1
    )
    assert len({c["pid"] for c in inits}) == RANKS  # one process per rank
    gens = [c for c in calls(fresh_log) if c["event"] == "generate"]
    assert all(g["use_tqdm"] is False for g in gens)
    seeds = sorted(r["seq_seed"] for g in gens for r in g["requests"])
    assert seeds == sorted(determinism.seq_seed(7, str(i), 0) for i in range(5))
    assert [r.request_id for r in results] == [str(i) for i in range(5)]
    assert all(len(r.output_logprobs) == len(r.output_token_ids) for r in results)
    assert fp["engine"] == "deepinfer" and fp["deepinfer_version"] == "0.1.0"
    assert fp["switches"] == PINNED | {"DEEPINFER_USE_NEXTN_DECODE": "5",
                                       "DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL": "0"}  # fmt: skip
    assert fp["engine_version"] == "2"
    assert fp["versions"]["deepinfer"] == "0.1.0" and fp["versions"]["deep_gemm"] == "0.0.0+fake"
    assert set(fp["versions"]) >= {"torch", "cuda", "deep_ep", "flash_mla", "deep_select"}
    assert fp["gpu"] == ["NVIDIA B300 SXM6"] and fp["driver"] == ["580.65.06"]
    assert (
        fp["model"] == "deepseek-ai/DeepSeek-V4.1-Flash-1017" and len(fp["weights_checksum"]) == 64
    )


def test_results_do_not_depend_on_the_split(ray_runtime, model_dir):
    """1 rank vs 2 ranks, and the requests in reverse order: the same result per request."""
    outs = {}
    for ranks, order in ((1, 1), (RANKS, -1)):
        engine = create_engine("deepinfer", **options(model_dir, engines_per_replica=ranks))
        engine.start()
        try:
            res = engine.generate(requests(7, stop_token_ids=[5])[::order])
        finally:
            engine.close()
        outs[ranks] = {r.request_id: (r.output_token_ids, r.output_logprobs, r.finish_reason)
                       for r in res}  # fmt: skip
    assert outs[1] == outs[RANKS]


def job(inp: Path, out: Path, model_dir: Path, **extra) -> dict:
    data = {
        "input": {"path": str(inp)},
        "prompt": {"column": "q", "chat": True},
        "id_column": "qid",
        "n": 2,
        "job_seed": 11,
        "sampling": {"temperature": 0.9, "max_tokens": 10, "logprobs": True},
        "engine": {"name": "deepinfer", "options": options(model_dir)},
        "pool": {"actors": 1, "cpus_per_actor": 0.25},
        "shard_size": 3,
        "output": str(out),
    }
    data.update(extra)
    return data


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("di-in") / "in.parquet"
    rows = [{"qid": f"p{i}", "q": f"Question number {i}?"} for i in range(8)]
    pq.write_table(pa.Table.from_pylist(rows), p)
    return p


def test_job_digest_is_topology_free_and_seeds_follow_the_formula(
    ray_runtime, prompts, model_dir, tmp_path
):
    a = JobRunner(parse_job_spec(job(prompts, tmp_path / "a", model_dir))).run()
    b_spec = job(prompts, tmp_path / "b", model_dir, shard_size=5)
    b_spec["pool"] = {"actors": 2, "cpus_per_actor": 0.25}
    b = JobRunner(parse_job_spec(b_spec)).run()
    assert a.run_digest == b.run_digest and a.config_hash == b.config_hash and a.rows == 16
    digest, rows = independent_run_digest(tmp_path / "a")
    assert digest == a.run_digest
    assert all(
        r["seq_seed"] == determinism.seq_seed(11, r["example_id"], r["sample_index"]) for r in rows
    )
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["engine"]["engine"] == "deepinfer"


def test_a_dying_rank_fails_the_replica_and_the_shard_is_retried(
    ray_runtime, prompts, model_dir, tmp_path
):
    clean = JobRunner(parse_job_spec(job(prompts, tmp_path / "clean", model_dir))).run()
    (model_dir / "die-rank-1").touch()  # rank 1 exits in its next generate call
    hit = JobRunner(parse_job_spec(job(prompts, tmp_path / "hit", model_dir))).run()
    assert not (model_dir / "die-rank-1").exists()
    assert hit.actor_restarts == 1
    assert hit.run_digest == clean.run_digest
    _, rows = independent_run_digest(tmp_path / "hit")
    keys = [(r["row_index"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 16


def test_a_replica_that_keeps_dying_fails_the_job_instead_of_thrashing(
    ray_runtime, prompts, model_dir, tmp_path
):
    spec = job(prompts, tmp_path / "thrash", model_dir)
    spec["pool"] = {**spec["pool"], "max_actor_restarts": 1, "max_shard_retries": 5}
    marker = model_dir / "die-always-rank-0"
    marker.touch()
    try:
        with pytest.raises(EngineError, match=r"died 2 times .*max_actor_restarts is 1"):
            JobRunner(parse_job_spec(spec)).run()
    finally:
        marker.unlink()
    assert not (tmp_path / "thrash" / "data").exists()


def test_structured_output_is_passed_through(ray_runtime, prompts, fresh_log, tmp_path):
    so = {"schema_type": "regex", "schema": "[a-z]+"}
    spec = job(prompts, tmp_path / "so", fresh_log)
    spec["sampling"] = {**spec["sampling"], "so_args": so}
    JobRunner(parse_job_spec(spec)).run()
    sent = [
        r["so_args"] for c in calls(fresh_log) if c["event"] == "generate" for r in c["requests"]
    ]
    assert sent and all(s == so for s in sent)
    smol = job(prompts, tmp_path / "x", fresh_log)
    smol["engine"] = {"name": "smollm2"}
    smol["sampling"] = spec["sampling"]
    with pytest.raises(ConfigError, match="so_args"):
        parse_job_spec(smol)


# -- preflight: each missing piece named ------------------------------------------------------
@pytest.fixture
def fake_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))
    monkeypatch.setenv("PATH", f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}")


def test_preflight_deepinfer_not_installed(monkeypatch, model_dir):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p).resolve() != FAKES.resolve()])
    with pytest.raises(EngineError, match=r"needs the `deepinfer` package.*rollout\[deepinfer\]"):
        preflight(DeepInferOptions(model=str(model_dir)), 8)


def test_preflight_no_driver(fake_importable, monkeypatch, model_dir, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineError, match="nvidia-smi is not on PATH"):
        preflight(DeepInferOptions(model=str(model_dir)), 8)


def test_preflight_wrong_gpu(fake_importable, monkeypatch, model_dir):
    monkeypatch.setenv("FAKE_GPU_NAME", "NVIDIA H200")
    monkeypatch.setenv("FAKE_GPU_CAP", "9.0")
    with pytest.raises(EngineError, match=r"needs SM100 GPUs .* NVIDIA H200 \(9\.0\)"):
        preflight(DeepInferOptions(model=str(model_dir)), 8)


def test_preflight_too_few_gpus(fake_importable, monkeypatch, model_dir):
    monkeypatch.setenv("FAKE_GPUS", "4")
    with pytest.raises(EngineError, match="needs 8 GPUs on one node .* has 4"):
        preflight(DeepInferOptions(model=str(model_dir)), 8)


def test_preflight_model_dir(fake_importable, monkeypatch, tmp_path):
    monkeypatch.delenv("DEEPINFER_HF_MODEL_DIR", raising=False)
    with pytest.raises(ConfigError, match="DEEPINFER_HF_MODEL_DIR"):
        preflight(DeepInferOptions(), 8)
    with pytest.raises(EngineError, match=f"{tmp_path / 'nope'} .* does not exist"):
        preflight(DeepInferOptions(model=str(tmp_path / "nope")), 8)
    monkeypatch.setenv("DEEPINFER_HF_MODEL_DIR", str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EngineError, match="lacks tokenizer.json, tokenizer_config.json, model.safetensors.index.json"):  # fmt: skip
        preflight(DeepInferOptions(), 8)


def test_preflight_names_missing_kernel_libraries(fake_importable, monkeypatch, model_dir):
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("flash_mla", "deepinfer._C") else real_find(name, *a))  # fmt: skip
    with pytest.raises(EngineError, match=r"incomplete.*deepinfer\._C .*flash_mla"):
        preflight(DeepInferOptions(model=str(model_dir)), 8)


def test_switches_and_bad_options():
    env = deepinfer_env(DeepInferOptions(eplb_step_interval=200, nextn_decode=0))
    assert env["DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL"] == "200"
    assert env["DEEPINFER_USE_NEXTN_DECODE"] == "0"
    with pytest.raises(ConfigError, match="engine.options.engines_per_replica"):
        create_engine("deepinfer", engines_per_replica=0)
    with pytest.raises(ConfigError, match="engine.options.tensor_parallel_size"):
        create_engine("deepinfer", tensor_parallel_size=8)
    # below the expert count window (100), DeepInfer refuses to start
    with pytest.raises(ConfigError, match="engine.options.eplb_step_interval"):
        create_engine("deepinfer", eplb_step_interval=50)
    with pytest.raises(ConfigError, match=r"max_num_seqs x \(1 \+ nextn_decode\) = 1536"):
        create_engine(
            "deepinfer", max_num_seqs=256, max_model_len=1024, max_num_batched_tokens=1200
        )
    with pytest.raises(ConfigError, match="at least max_model_len"):
        create_engine("deepinfer", max_num_seqs=8, max_model_len=8192, max_num_batched_tokens=4096)
    # the rendezvous is MASTER_PORT - 50: a port below 1074 would put it under 1024
    with pytest.raises(ConfigError, match="engine.options.master_port"):
        create_engine("deepinfer", master_port=1050)
    env = rank_env(DeepInferOptions(jit_cache_dir="/var/cache/deepinfer-jit"))
    assert env["DEEPINFER_JIT_CACHE_DIR"] == "/var/cache/deepinfer-jit"
    assert "DEEPINFER_JIT_CACHE_DIR" not in deepinfer_env(DeepInferOptions(jit_cache_dir="/x"))


def test_every_rank_is_called_in_every_round_even_with_nothing(ray_runtime, fresh_log):
    """1 request on a 2-rank replica: rank 1 has nothing, and must still step with rank 0
    (the stand-in fails a round that a rank misses, as the real engine would hang)."""
    engine = create_engine("deepinfer", **options(fresh_log))
    engine.start()
    try:
        [one] = engine.generate(requests(1))
        assert one.output_token_ids
    finally:
        engine.close()
    gens = [c for c in calls(fresh_log) if c["event"] == "generate"]
    assert sorted((g["rank"], g["prompts"]) for g in gens) == [(0, 1), (1, 0)]


def test_engine_side_finish_reasons_are_row_errors(ray_runtime, fresh_log):
    """stop and length end a row; each other DeepInfer finish reason is an error of that row
    (a rejected prompt's one output, its last prompt token, never becomes text)."""
    from rollout.engines.deepinfer import FINISH_ERRORS, FINISH_OK
    from rollout.errors import RowError

    FINISH_REASONS = (
        *FINISH_OK,
        *FINISH_ERRORS,
    )  # the stand-in's order (checked by the contract test)
    FINISH_TRIGGER = (
        99_000  # the stand-in ends a prompt starting with FINISH_TRIGGER + k with reason k
    )

    engine = create_engine("deepinfer", **options(fresh_log, max_model_len=64))
    engine.start()
    try:
        params = SamplingParams(temperature=0.8, max_tokens=8)
        for k, reason in enumerate(FINISH_REASONS[2:], start=2):
            bad = GenerationRequest("bad", [FINISH_TRIGGER + k, 5, 6], params, 1)
            with pytest.raises(RowError, match=f"request 'bad': .*finish reason {reason!r}") as err:
                engine.generate([GenerationRequest("ok", [7, 8], params, 2), bad])
            assert err.value.reason == reason and err.value.request_id == "bad"
        eos = [r for r in engine.generate(requests(40)) if r.finish_reason == "stop"]
    finally:
        engine.close()
    assert eos and all(r.output_token_ids[-1] == 1 for r in eos)  # EOS id 1, kept as the last token
    decode = engine._tokenizer.decode
    assert all(
        r.output_text == decode(r.output_token_ids[:-1], skip_special_tokens=True) for r in eos
    )


def test_a_prompt_the_engine_rejects_is_a_row_error_not_text():
    """DeepInfer answers a prompt it rejects with one output: its last prompt token, finish
    reason prompt_length_exceeded. (Our own check refuses such prompts first, with the same
    max_model_len; the engine's limits can still be tighter, max_num_batched_tokens.)"""
    from rollout.engines.deepinfer import RankOutput, finish, prepare
    from rollout.errors import RowError

    req = GenerationRequest("L", [5, 6, 7], SamplingParams(max_tokens=4), 9)
    prepared = prepare(req, 0, 64)
    rejected = RankOutput(0, [7], [0.0], None, "prompt_length_exceeded")
    with pytest.raises(RowError, match="'L': the prompt is longer.*'prompt_length_exceeded'"):
        finish(req, prepared, rejected, frozenset({1}), lambda ids: "")
    ok = finish(req, prepared, RankOutput(0, [9, 1], [-0.5, -0.25], None, "stop"), frozenset({1}),
                lambda ids: "x" * len(ids))  # fmt: skip
    assert (ok.output_token_ids, ok.finish_reason) == ([9, 1], "stop")


def test_prompts_are_tokenized_as_deepinfer_does(ray_runtime, fresh_log):
    engine = create_engine("deepinfer", **options(fresh_log))
    engine.start()
    try:
        ids = engine.encode("Hello there")
    finally:
        engine.close()
    assert (
        ids[0] == 0
        and ids[1:] == engine._tokenizer("Hello there", add_special_tokens=False)["input_ids"]
    )


def _sm100_present() -> bool:
    import importlib.util

    if importlib.util.find_spec("deepinfer") is None or "fakes" in str(
        importlib.util.find_spec("deepinfer").origin
    ):
        return False
    try:
        from rollout.engines.deepinfer import query_gpus

        return any(g.compute_capability.startswith("10.") for g in query_gpus())
    except EngineError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _sm100_present(), reason="needs deepinfer and SM100 GPUs (B200/B300)")
def test_canary_on_real_hardware(ray_runtime):
    """Two prompts on a real node (DEEPINFER_HF_MODEL_DIR set), twice: identical bits."""
    engine = create_engine("deepinfer")
    engine.start()
    try:
        prompt = engine.encode(
            engine.apply_chat_template([{"role": "user", "content": "The capital of France is?"}])
        )
        reqs = [GenerationRequest(str(i), prompt, SamplingParams(temperature=0.8, max_tokens=16, logprobs=True),
                                  determinism.seq_seed(1, str(i), 0)) for i in range(2)]  # fmt: skip
        first, again = engine.generate(reqs), engine.generate(reqs[::-1])[::-1]
    finally:
        engine.close()
    assert [r.output_token_ids for r in first] == [r.output_token_ids for r in again]
    assert [r.output_logprobs for r in first] == [r.output_logprobs for r in again]
    assert "paris" in first[0].output_text.lower()


def test_shipped_layout_config():
    from rollout.jobs.spec import load_job_spec

    root = Path(__file__).resolve().parents[2]
    spec = load_job_spec(root / "configs" / "deepseek-v41-flash-8xb300.yaml")
    engine = create_engine(spec.engine.name, **spec.engine.options)
    assert engine.options.engine_args() == {
        "data_parallel_size": 8, "expert_parallel_size": 8, "max_num_seqs": 256,
        "max_model_len": 8192, "gpu_memory_utilization": 0.9, "revision": None,
        "decode_sequence": False}  # fmt: skip
    assert deepinfer_env(engine.options)["DEEPINFER_BATCH_INVARIANT"] == "1"
    assert spec.pool.gpus_per_actor == 0 and engine.options.gpus_per_engine == 1


def test_the_acceptance_script_runs_against_the_stand_in(ray_runtime, model_dir, tmp_path):
    """scripts/deepinfer_acceptance.py, shrunk to the stand-in's 2 ranks without GPUs: every
    check passes and the report names them (on a real node it runs at full size)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    try:
        import deepinfer_acceptance
    finally:
        sys.path.pop(0)
    rc = deepinfer_acceptance.main([
        "--model", str(model_dir), "--out", str(tmp_path), "--ranks", "2", "--gpus-per-engine", "0",
        "--cpus-per-engine", "0.25", "--max-model-len", "4096", "--max-tokens", "8", "--rows", "30",
        "--batch-sizes", "24,8,3", "--no-expect-paris",
    ])  # fmt: skip
    report = (tmp_path / "report.md").read_text()
    assert rc == 0, report
    for check in ("canary", "rank 0 vs rank 1", "batch 3x1 vs 8 vs 24", "30-row job twice"):
        assert f"| {check}" in report and "| FAIL |" not in report
    assert "verdict: **PASS**" in report and '"engine": "deepinfer"' in report


def test_teacher_forcing_passes_the_completion_as_golden_token_ids(ray_runtime, fresh_log):
    """A teacher-forced request reaches every rank's engine with golden_token_ids (the real
    SamplingParams argument: the contract test checks the stand-in's signature against the
    sdist) and comes back as the given tokens with their logprobs, finish reason length,
    whatever the split and whatever else is in the batch."""
    params = SamplingParams(temperature=0.8, max_tokens=4, logprobs=True)
    golden = [11, 12, 13, 14, 15, 16]  # longer than max_tokens: the completion decides
    forced = GenerationRequest("tf", [7, 8, 9], params, 3, forced_output=golden)
    outs = []
    for ranks in (1, RANKS):
        engine = create_engine("deepinfer", **options(fresh_log, engines_per_replica=ranks))
        engine.start()
        try:
            res = engine.generate([GenerationRequest("free", [7, 8], params, 2), forced])
        finally:
            engine.close()
        tf = next(r for r in res if r.request_id == "tf")
        assert tf.output_token_ids == golden and tf.finish_reason == "length"
        assert len(tf.output_logprobs) == len(golden)
        outs.append(tf.output_logprobs)
    assert outs[0] == outs[1]
    sent = [r for c in calls(fresh_log) if c.get("event") == "generate" for r in c["requests"]]
    assert sorted(str(r["golden_token_ids"]) for r in sent if r["golden_token_ids"]) == [str(golden)] * 2  # fmt: skip
    assert all(r["max_tokens"] == len(golden) for r in sent if r["golden_token_ids"])
