"""OpenAI Batch API request files as rollout input (`input.format: openai-batch`).

Each line is a request: `{"custom_id", "method": "POST", "url": "/v1/chat/completions" or
"/v1/completions", "body": {...}}`. A line becomes a row: `custom_id` (the example id),
`url`, `messages` (chat) or `prompt` (completions), `model`, and `params`: the request's own
sampling parameters as JSON (temperature, top_p, max_tokens or max_completion_tokens, n,
stop, seed, logprobs, top_logprobs, response_format), which override the job's for that
row; a row's `seed` takes the place of job_seed in its seq_seed. They are part of the file,
so `config_hash` covers them through the input's fingerprint; every output row records the
parameters it was made with (`request_params`, with the model and the endpoint url).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from rollout.errors import InputError

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMA = pa.schema([
    ("custom_id", pa.string()), ("url", pa.string()), ("model", pa.string()),
    ("messages", pa.list_(MESSAGE)), ("prompt", pa.string()), ("params", pa.string()),
])  # fmt: skip
SAMPLING = ("temperature", "top_p", "max_tokens", "max_completion_tokens", "n", "stop", "seed",
            "logprobs", "top_logprobs", "response_format")  # fmt: skip
# fields that do not change what is generated
IGNORED = ("user", "metadata", "store", "service_tier", "stream", "stream_options", "parallel_tool_calls")  # fmt: skip


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):  # fmt: skip
                raise InputError(where, "only text content parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise InputError(where, f"must be a string or a list of text parts, got {type(content).__name__}")  # fmt: skip


def request_row(line: Any) -> dict[str, Any]:
    """One request line as a row (InputError naming the field that is wrong)."""
    if not isinstance(line, dict):
        raise InputError("request", "must be a JSON object")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise InputError("custom_id", "must be a non-empty string")
    where = f"request {custom_id!r}"
    if line.get("method", "POST") != "POST":
        raise InputError(f"{where}: method", f"must be POST, got {line.get('method')!r}")
    url = line.get("url")
    if url not in (CHAT, COMPLETIONS):
        raise InputError(f"{where}: url", f"must be {CHAT} or {COMPLETIONS}, got {url!r}")
    body = line.get("body")
    if not isinstance(body, dict):
        raise InputError(f"{where}: body", "must be a JSON object")
    unknown = sorted(set(body) - set(SAMPLING) - set(IGNORED) - {"model", "messages", "prompt"})
    if unknown:
        raise InputError(f"{where}: body.{unknown[0]}", f"is not supported by rollout (supported: model, messages, prompt, {', '.join(SAMPLING)})")  # fmt: skip
    messages = prompt = None
    if url == CHAT:
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw:
            raise InputError(f"{where}: body.messages", "must be a non-empty list")
        messages = []
        for i, m in enumerate(raw):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise InputError(f"{where}: body.messages[{i}]", "must be {role, content}")
            messages.append({"role": m["role"], "content": _text(m.get("content"), f"{where}: body.messages[{i}].content")})  # fmt: skip
    else:
        raw = body.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
            raw = raw[0]
        if not isinstance(raw, str):
            raise InputError(f"{where}: body.prompt", "must be a string (one prompt per request)")
        prompt = raw
    params = {k: body[k] for k in SAMPLING if k in body and body[k] is not None}
    return {"custom_id": custom_id, "url": url, "model": str(body.get("model", "")),
            "messages": messages, "prompt": prompt,
            "params": json.dumps(params, sort_keys=True, ensure_ascii=False)}  # fmt: skip


def row_sampling(row: dict[str, Any], base: Any, job_seed: int, n: int, where: str) -> tuple[Any, int, int]:  # fmt: skip
    """(SamplingParams, n, seed) for one request: the job's, overridden by the request's."""
    from pydantic import ValidationError

    from rollout.sampling_params import SamplingParams

    params = json.loads(row.get("params") or "{}")
    update: dict[str, Any] = {}
    for key in ("temperature", "top_p"):
        if key in params:
            update[key] = params[key]
    tokens = params.get("max_completion_tokens", params.get("max_tokens"))
    if tokens is not None:
        update["max_tokens"] = tokens
    if "stop" in params:
        stop = params["stop"]
        update["stop"] = [stop] if isinstance(stop, str) else list(stop)
    logprobs = params.get("logprobs")
    if (
        row.get("url") == COMPLETIONS
        and isinstance(logprobs, int)
        and not isinstance(logprobs, bool)
    ):
        update["logprobs"], update["top_logprobs"] = logprobs > 0 or bool(base.logprobs), logprobs
    elif logprobs is not None:
        update["logprobs"] = bool(logprobs)
        if "top_logprobs" in params:
            update["top_logprobs"] = params["top_logprobs"]
    fmt = params.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        update["so_args"] = {"schema_type": "json", "schema": json.dumps(schema)}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        update["so_args"] = {"schema_type": "json", "schema": json.dumps({"type": "object"})}
    elif fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise InputError(f"{where}: body.response_format", f"must be text, json_object or json_schema, got {fmt!r}")  # fmt: skip
    try:
        sampling = SamplingParams(**(base.model_dump(by_alias=True) | update))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(f"{where}: body.{'.'.join(map(str, first['loc']))}", first["msg"]) from None  # fmt: skip
    rows_n = params.get("n", n)
    if not isinstance(rows_n, int) or isinstance(rows_n, bool) or not 1 <= rows_n <= 128:
        raise InputError(f"{where}: body.n", f"must be an integer in [1, 128], got {rows_n!r}")
    seed = params.get("seed", job_seed)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**64:
        raise InputError(f"{where}: body.seed", f"must be an unsigned 64-bit integer, got {seed!r}")
    return sampling, rows_n, seed
