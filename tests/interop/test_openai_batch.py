"""OpenAI Batch files in and out: a request file (chat and completions, per-request
sampling, n, seed, logprobs, one request too long) runs as a job on smollm2; its export
parses, line by line, with the `openai` package's own types; per-request parameters
decide the rows (a request's seed replaces job_seed in its seq_seed)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai.types import BatchError, Completion
from openai.types.chat import ChatCompletion

from rollout import determinism
from rollout.data.export_openai import export_openai_batch
from rollout.data.openai_batch import request_row
from rollout.errors import InputError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner

REQUESTS = [
    {"custom_id": "chat-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "smollm2-135m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a color."}],
              "max_tokens": 12, "temperature": 0.7, "n": 3, "seed": 5, "logprobs": True, "top_logprobs": 2}},
    {"custom_id": "chat-2", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "smollm2-135m", "messages": [{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}],
              "max_completion_tokens": 8, "temperature": 0, "stop": ["\n"]}},
    {"custom_id": "text-1", "method": "POST", "url": "/v1/completions",
     "body": {"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "logprobs": 2}},
    {"custom_id": "too-long", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "smollm2-135m", "messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 4}},
]  # fmt: skip


@pytest.fixture(scope="module")
def batch_run(ray_runtime, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("openai")
    (tmp / "batch.jsonl").write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
    spec = parse_job_spec({"input": {"path": str(tmp / "batch.jsonl"), "format": "openai-batch"},
                           "engine": {"name": "smollm2"}, "on_error": "skip", "job_seed": 99,
                           "pool": {"actors": 1, "cpus_per_actor": 1}, "output": str(tmp / "run")})  # fmt: skip
    summary = JobRunner(spec).run()
    assert summary.rows == 3 + 1 + 1 and summary.skipped_rows == 1
    return tmp


def test_requests_decide_their_rows(batch_run):
    table = pa.concat_tables(pq.read_table(p) for p in sorted((batch_run / "run" / "data").glob("*.parquet")))  # fmt: skip
    rows = table.to_pylist()
    assert [(r["example_id"], r["sample_index"]) for r in rows] == [("chat-1", 0), ("chat-1", 1), ("chat-1", 2), ("chat-2", 0), ("text-1", 0)]  # fmt: skip
    chat1 = [r for r in rows if r["example_id"] == "chat-1"]
    assert all(
        r["seq_seed"] == determinism.seq_seed(5, "chat-1", r["sample_index"]) for r in chat1
    )  # the request's seed
    assert rows[3]["seq_seed"] == determinism.seq_seed(99, "chat-2", 0)  # no seed: job_seed
    assert all(len(r["top_logprobs"]) == len(r["output_token_ids"]) and len(r["top_logprobs"][0]) == 2 for r in chat1)  # fmt: skip
    assert rows[3]["output_logprobs"] is None and rows[3]["num_output_tokens"] <= 8
    params = json.loads(rows[0]["request_params"])
    assert (params["temperature"], params["max_tokens"], params["n"], params["seed"], params["model"]) == (0.7, 12, 3, "5", "smollm2-135m")  # fmt: skip
    assert json.loads(rows[3]["request_params"])["stop"] == ["\n"]
    assert rows[4]["prompt"] == "The capital of France is" and rows[4]["output_text"].startswith(
        " Paris"
    )
    errors = [json.loads(x) for x in (batch_run / "run" / "errors.jsonl").read_text().splitlines()]
    assert errors == [{"row_index": 3, "example_id": "too-long", "stage": "tokenize",
                       "reason": "the prompt has 3031 tokens, which leaves no room in the context of 2048 tokens (max_model_len); shorten it or set sampling.truncate_prompt_tokens"}]  # fmt: skip


def test_the_export_parses_with_the_openai_packages_types(batch_run):
    out = batch_run / "out.jsonl"
    assert export_openai_batch(str(batch_run / "run"), str(out)) == (3, 1)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ["chat-1", "chat-2", "text-1"]
    table = pa.concat_tables(pq.read_table(p) for p in sorted((batch_run / "run" / "data").glob("*.parquet")))  # fmt: skip
    texts = {(r["example_id"], r["sample_index"]): r["output_text"] for r in table.to_pylist()}
    for line in lines:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        body = line["response"]["body"]
        if line["custom_id"].startswith("chat"):
            completion = ChatCompletion.model_validate(body)
            assert completion.object == "chat.completion" and completion.model == "smollm2-135m"
            for choice in completion.choices:
                assert choice.message.content == texts[(line["custom_id"], choice.index)]
        else:
            completion = Completion.model_validate(body)
            assert completion.choices[0].text == texts[("text-1", 0)]
            assert len(completion.choices[0].logprobs.top_logprobs[0]) == 2
        assert completion.system_fingerprint.startswith("fp_")
        assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens  # fmt: skip
    chat1 = ChatCompletion.model_validate(lines[0]["response"]["body"])
    assert len(chat1.choices) == 3
    first = chat1.choices[0]
    assert "".join(t.token for t in first.logprobs.content) == first.message.content
    assert all(len(t.top_logprobs) == 2 for t in first.logprobs.content)
    errors = [json.loads(x) for x in (batch_run / "out_errors.jsonl").read_text().splitlines()]
    assert [e["custom_id"] for e in errors] == ["too-long"]
    BatchError.model_validate(errors[0]["error"])
    again = batch_run / "again.jsonl"
    export_openai_batch(str(batch_run / "run"), str(again))
    assert again.read_bytes() == out.read_bytes()  # the same bytes every time


@pytest.mark.parametrize(("line", "needle"), [
    ({"custom_id": "x", "url": "/v1/embeddings", "body": {}}, "url"),
    ({"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {}}, "method"),
    ({"url": "/v1/completions", "body": {"prompt": "a"}}, "custom_id"),
    ({"custom_id": "x", "url": "/v1/chat/completions", "body": {"messages": []}}, "body.messages"),
    ({"custom_id": "x", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "a"}], "logit_bias": {"1": 5}}}, "body.logit_bias"),
    ({"custom_id": "x", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}}, "content"),
])  # fmt: skip
def test_bad_requests_name_the_field(line, needle):
    with pytest.raises(InputError) as err:
        request_row(line)
    assert needle in err.value.where
