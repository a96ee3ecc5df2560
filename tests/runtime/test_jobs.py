"""Rollout jobs end to end: real Parquet in, a real Ray pool, the real model, Parquet out."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.errors import ConfigError, InputError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime.manifest import Manifest
from rollout.runtime.runner import JobRunner
from tests.runtime.conftest import independent_run_digest

QUESTIONS = [
    "What is the capital of France?", "Name a primary color.", "What is 2 + 2?", "Say hello in Spanish.",
    "What do bees make?", "Name a planet.", "What is ice made of?", "Give a synonym for happy.",
    "What animal says moo?", "Name a fruit that is yellow.", "How many days are in a week?",
    "What is the opposite of cold?", "Name a musical instrument.", "What color is grass?",
    "Where does the sun rise?", "What is a baby cat called?", "Name a shape with three sides.",
    "What do you use to write?", "Which season comes after winter?", "What is H2O?",
]  # fmt: skip


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("input")
    rows = [
        {"qid": f"q{i:02d}", "question": q, "topic": f"t{i % 3}"} for i, q in enumerate(QUESTIONS)
    ]
    pq.write_table(pa.Table.from_pylist(rows[:11]), d / "part-a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[11:]), d / "part-b.parquet")
    return d


def spec(prompts: Path, out: Path, **over):
    data = {
        "input": {"path": str(prompts)},
        "prompt": {"column": "question", "chat": True},
        "id_column": "qid",
        "carry_columns": ["topic"],
        "n": 2,
        "job_seed": 99,
        "sampling": {"temperature": 0.8, "top_p": 0.95, "max_tokens": 6, "logprobs": True},
        "engine": {"name": "smollm2", "options": {"max_num_seqs": 16}},
        "pool": {"actors": 1},
        "shard_size": 7,
        "output": str(out),
    }
    for key, value in over.items():
        node = data
        *parents, leaf = key.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return parse_job_spec(data)


class StopAfter:
    """A progress hook that presses Ctrl-C after `n` shards complete."""

    def __init__(self, n: int) -> None:
        self.n = n

    def start(self, manifest) -> None:
        pass

    def shard_done(self, result, manifest) -> None:
        if manifest.done >= self.n:
            raise KeyboardInterrupt


@pytest.fixture(scope="module")
def reference(ray_runtime, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "reference"
    summary = JobRunner(spec(prompts, out)).run()
    return out, summary


def test_run_writes_rows_seeds_hashes_and_manifest(reference):
    out, summary = reference
    digest, rows = independent_run_digest(out)
    assert summary.run_digest == digest
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["run_digest"] == digest
    assert manifest["config_hash"] == summary.config_hash
    assert [(s["start"], s["end"]) for s in manifest["shards"]] == [(0, 7), (7, 14), (14, 20)]
    # every (row_index, sample_index) exactly once, with the formula's seed
    keys = [(r["row_index"], r["sample_index"]) for r in rows]
    assert keys == [(i, s) for i in range(20) for s in range(2)]
    for r in rows:
        payload = f"99\0q{r['row_index']:02d}\0{r['sample_index']}".encode()
        seed = int.from_bytes(
            hashlib.blake2b(b"rollout-seed-v1\0" + payload, digest_size=8).digest(), "little"
        )
        assert r["seq_seed"] == seed and r["example_id"] == f"q{r['row_index']:02d}"
        assert r["input_topic"] == f"t{r['row_index'] % 3}"
        assert (
            r["num_output_tokens"] == len(r["output_token_ids"]) == len(r["output_logprobs"]) <= 6
        )
        assert (
            r["prompt"].startswith("<|im_start|>system")
            and QUESTIONS[r["row_index"]] in r["prompt"]
        )
    schema = pq.read_schema(out / "data" / "part-000000.parquet")
    assert schema.field("seq_seed").type == pa.uint64()
    assert schema.field("output_token_ids").type == pa.list_(pa.int32())
    assert schema.field("output_logprobs").type == pa.list_(pa.float32())
    assert (
        schema.field("row_index").type == pa.int64()
        and schema.field("sample_index").type == pa.int32()
    )
    assert not (out / ".incomplete").exists() and (out / "errors.jsonl").read_text() == ""


def test_digest_is_the_same_across_actors_shard_sizes_and_runs(reference, prompts, tmp_path):
    _, ref = reference
    two_actors = JobRunner(spec(prompts, tmp_path / "a", pool__actors=2, shard_size=50)).run()
    again = JobRunner(spec(prompts, tmp_path / "b", pool__actors=2)).run()
    assert two_actors.run_digest == again.run_digest == ref.run_digest
    assert two_actors.config_hash == ref.config_hash
    other_seed = JobRunner(spec(prompts, tmp_path / "c", job_seed=100, shard_size=50)).run()
    assert other_seed.run_digest != ref.run_digest and other_seed.config_hash != ref.config_hash


def test_interrupted_run_resumes_to_the_same_digest(reference, prompts, tmp_path):
    _, ref = reference
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):
        JobRunner(spec(prompts, out, shard_size=4), progress=StopAfter(2)).run()
    manifest = Manifest.load(out)
    assert manifest.status == "running" and 2 <= manifest.done < len(manifest.shards)
    assert not (out / "data").exists()  # nothing a reader could take as complete
    resumed = JobRunner(spec(prompts, out, shard_size=4)).run()
    assert resumed.shards_resumed >= 2 and resumed.run_digest == ref.run_digest
    assert independent_run_digest(out)[0] == ref.run_digest


def test_corrupted_shard_is_detected_and_regenerated(reference, prompts, tmp_path):
    _, ref = reference
    out = tmp_path / "x"
    JobRunner(spec(prompts, out)).run()
    victim = out / "data" / "part-000001.parquet"
    t = pq.read_table(victim)
    ids = t.column("output_token_ids").to_pylist()
    ids[0] = [(ids[0][0] + 1) % 49152, *ids[0][1:]]
    pq.write_table(t.set_column(t.schema.get_field_index("output_token_ids"), "output_token_ids",
                                pa.array(ids, pa.list_(pa.int32()))), victim)  # fmt: skip
    again = JobRunner(spec(prompts, out)).run()
    assert again.shards_resumed == 2 and again.run_digest == ref.run_digest


def engine_actor_pids() -> list[int]:
    """Live engine actor processes (Ray titles them `ray::EngineWorker...`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::EngineWorker"):
                pids.append(int(entry.name))
    return sorted(pids)


def test_killed_actor_is_replaced_and_the_digest_holds(reference, prompts, tmp_path):
    _, ref = reference
    killed: list[int] = []
    before = set(engine_actor_pids())

    class KillOnceRunning:
        """SIGKILL one engine actor while both hold shards (10 shards, 2 in flight each)."""

        def start(self, manifest):
            def kill():
                time.sleep(0.3)
                pid = sorted(set(engine_actor_pids()) - before)[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

            threading.Thread(target=kill, daemon=True).start()

        def shard_done(self, result, manifest):
            pass

    job = spec(prompts, tmp_path / "k", pool__actors=2, shard_size=2)
    summary = JobRunner(job, progress=KillOnceRunning()).run()
    assert killed and summary.actor_restarts == 1
    assert summary.run_digest == ref.run_digest
    _, rows = independent_run_digest(tmp_path / "k")
    assert [(r["row_index"], r["sample_index"]) for r in rows] == [
        (i, s) for i in range(20) for s in range(2)
    ]


def test_output_directory_of_another_config_is_refused(reference, prompts):
    out, _ = reference
    with pytest.raises(ConfigError) as err:
        JobRunner(spec(prompts, out, sampling__temperature=0.5)).run()
    assert "holds a run of another config" in str(err.value)
    assert "differing fields: sampling.temperature" in str(err.value)
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path / "in.parquet")
    return path


@pytest.mark.parametrize(
    ("rows", "over", "message"),
    [
        ([{"qid": "a", "text": "hi"}], {}, "has no column 'question' (prompt.column); available columns: qid, text"),
        ([{"qid": "a", "question": "x"}, {"qid": "a", "question": "y"}], {},
         "id column 'qid': value 'a' appears at rows 0 and 1; ids must be unique"),
        ([{"qid": "a", "question": "x"}, {"qid": "b", "question": None}], {},
         "input row 1 (example 'b'): column 'question' is null"),
        ([{"qid": "a", "question": "  "}], {}, "input row 0 (example 'a'): the prompt is empty"),
        ([{"qid": "a", "m": [{"role": "user", "text": "x"}]}], {"prompt": {"messages_column": "m"}},
         "message 0 must be {role: string, content: string}"),
        ([{"qid": "a", "m": "hello"}], {"prompt": {"messages_column": "m"}},
         "column 'm' (prompt.messages_column) holds string, not a list"),
        ([], {}, "has 0 rows"),
    ],
)  # fmt: skip
def test_bad_input_fails_clearly_and_leaves_nothing_complete(
    ray_runtime, prompts, tmp_path, rows, over, message
):
    src = write_rows(tmp_path / "in", rows) if rows else _empty(tmp_path / "in")
    out = tmp_path / "out"
    job = spec(src, out, carry_columns=[], **over)
    with pytest.raises(InputError) as err:
        JobRunner(job).run()
    assert message in str(err.value)
    assert not (out / "data").exists()
    m = Manifest.load(out) if out.exists() else None
    assert m is None or m.status == "running"


def _empty(path: Path) -> Path:
    path.mkdir(parents=True)
    pq.write_table(
        pa.table({"qid": pa.array([], pa.string()), "question": pa.array([], pa.string())}),
        path / "e.parquet",
    )
    return path


def test_missing_and_corrupt_input_files(ray_runtime, prompts, tmp_path):
    with pytest.raises(InputError, match="no such file or directory"):
        JobRunner(spec(tmp_path / "nope.parquet", tmp_path / "o1")).run()
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\x00" * 64)
    with pytest.raises(InputError, match="is not a readable Parquet file"):
        JobRunner(spec(bad, tmp_path / "o2")).run()
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_empty_prompts_can_be_skipped_and_listed(ray_runtime, tmp_path):
    rows = [
        {"qid": "a", "question": "Name a color."},
        {"qid": "b", "question": None},
        {"qid": "c", "question": ""},
    ]
    src = write_rows(tmp_path / "in", rows)
    summary = JobRunner(
        spec(
            src,
            tmp_path / "out",
            carry_columns=[],
            prompt={"column": "question", "on_empty": "skip"},
        )
    ).run()
    assert summary.rows == 2 and summary.skipped_rows == 2
    errors = [
        json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()
    ]
    assert errors == [
        {
            "row_index": 1,
            "example_id": "b",
            "stage": "render",
            "reason": "column 'question' is null",
        },
        {"row_index": 2, "example_id": "c", "stage": "render", "reason": "the prompt is empty"},
    ]


def test_finished_run_reads_as_one_dataset_everywhere(reference):
    out, summary = reference
    data = out / "data"
    import datasets
    import pandas as pd
    import pyarrow.dataset as pads

    assert pads.dataset(data, format="parquet").count_rows() == summary.rows == 40
    assert len(datasets.load_dataset("parquet", data_dir=str(data), split="train")) == 40
    assert len(pd.read_parquet(data)) == 40
    polars = pytest.importorskip("polars")
    assert polars.read_parquet(f"{data}/*.parquet").height == 40
    duckdb = pytest.importorskip("duckdb")
    assert duckdb.sql(f"select count(*) from '{data}/*.parquet'").fetchall() == [(40,)]


def test_one_writer_per_output_directory(reference, prompts):
    import fcntl

    out, _ = reference
    with open(out / ".lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(ConfigError, match="is being written by another rollout run"):
            JobRunner(spec(prompts, out)).run()


def test_a_directory_that_is_not_a_run_is_refused(ray_runtime, prompts, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="non-empty directory that holds no rollout run"):
        JobRunner(spec(prompts, tmp_path)).run()
    assert (tmp_path / "notes.txt").read_text() == "mine"
