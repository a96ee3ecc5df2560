"""The job spec: loading, overrides, errors that name the field, the exported schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.errors import ConfigError
from rollout.jobs.spec import job_spec_json_schema, load_job_spec, parse_job_spec

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_demo_config_loads_and_flags_override(tmp_path):
    spec = load_job_spec(
        ROOT / "configs" / "demo.yaml", {"pool.actors": 3, "shard_size": 5, "output": "x"}
    )
    assert (spec.pool.actors, spec.shard_size, spec.output, spec.n) == (3, 5, "x", 2)
    assert spec.prompt.messages_column == "messages" and spec.sampling.temperature == 0.8


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("input: {path: x}\nprompt: {column: q}\nbogus: 1\n", "invalid bogus: Extra inputs are not permitted"),
        ("input: {path: x}\nprompt: {column: q}\nsampling: {top_p: 2}\n", "invalid sampling.top_p: top_p must be in (0, 1], got 2"),
        ("input: {path: x}\nprompt: {column: q, template: 'a {b}'}\n", "exactly one of column, messages_column, template"),
        ("input: {path: x}\nprompt: {column: q}\njob_seed: -1\n", "job_seed must be an unsigned 64-bit integer, got -1"),
        ("input: {path: x}\nprompt: {column: q}\nn: 0\n", "invalid n:"),
        ("prompt: {column: q}\n", "invalid input: Field required"),
        ("input: [1, 2\n", "is not valid YAML"),
        ("- just\n- a list\n", "must be a mapping of fields, got list"),
    ],
)  # fmt: skip
def test_bad_specs_name_the_field(tmp_path, text, message):
    with pytest.raises(ConfigError) as err:
        load_job_spec(write(tmp_path, text))
    assert message in str(err.value)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot be read"):
        load_job_spec(tmp_path / "missing.yaml")
    p = tmp_path / "latin1.yaml"
    p.write_bytes("input: {path: caf\xe9}".encode("latin-1"))
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        load_job_spec(p)
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_job_spec(write(tmp_path, "{oops", "job.json"))


def test_exported_schema_matches_the_model():
    committed = json.loads((ROOT / "docs" / "job-spec.schema.json").read_text())
    assert committed == job_spec_json_schema(), (
        "run `make schema` to regenerate docs/job-spec.schema.json"
    )


def test_top_logprobs_up_to_what_the_engine_returns():
    base = {"input": {"path": "x.parquet"}, "prompt": {"column": "q"}, "output": "out"}
    spec = parse_job_spec(
        base | {"engine": {"name": "deepinfer"}, "sampling": {"top_logprobs": 1000}}
    )
    assert spec.sampling.top_logprobs == 1000
    for engine in ("smollm2", "synthetic"):
        with pytest.raises(
            ConfigError, match=f"top_logprobs is 21; engine '{engine}' returns at most 20"
        ):
            parse_job_spec(base | {"engine": {"name": engine}, "sampling": {"top_logprobs": 21}})
