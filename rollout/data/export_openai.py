"""A run as OpenAI Batch API output: `rollout export RUN --format openai-batch --output F`.

One output line per request (input row): `{"id", "custom_id", "response": {"status_code":
200, "request_id", "body": <a chat.completion or text_completion>}, "error": null}`, with
the row's n samples as `choices` (their index the sample index), `usage`, and a
`system_fingerprint` made from the engine fingerprint (so two runs of one engine show the
same). Rows left out with `on_error: skip` go to the error file (`--errors`, default
F with `_errors` before its extension) as `{"id", "custom_id", "response": null, "error":
{"code", "message"}}`. Ids are derived from the run digest and the custom_id: exporting a
run twice writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from rollout import determinism
from rollout.audit.runs import RunDir
from rollout.errors import ConfigError
from rollout.runtime.manifest import write_text_atomic

COLUMNS = ["row_index", "example_id", "sample_index", "output_text", "output_token_ids",
           "finish_reason", "num_prompt_tokens", "num_output_tokens", "request_params"]  # fmt: skip


def _id(prefix: str, run_digest: str, custom_id: str) -> str:
    return prefix + hashlib.sha256(f"{run_digest}\n{custom_id}".encode()).hexdigest()[:24]


def _token_entry(decode: Callable[[int], str] | None, token: int, logprob: float) -> dict[str, Any]:
    text = decode(token) if decode else f"<{token}>"
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def _chat_logprobs(row: dict[str, Any], decode: Callable[[int], str] | None) -> dict[str, Any] | None:  # fmt: skip
    lps = row.get("output_logprobs")
    if lps is None:
        return None
    tops = row.get("top_logprobs") or [None] * len(lps)
    content = []
    tokens = list(row["output_token_ids"])
    if _ends_in_eos(row, decode):  # the text leaves the end-of-sequence token out: so do these
        tokens, lps, tops = tokens[:-1], lps[:-1], tops[:-1]
    for token, lp, top in zip(tokens, lps, tops, strict=True):
        entry = _token_entry(decode, token, lp)
        entry["top_logprobs"] = [_token_entry(decode, t["token_id"], t["logprob"]) for t in (top or [])]  # fmt: skip
        content.append(entry)
    return {"content": content, "refusal": None}


def _ends_in_eos(row: dict[str, Any], decode: Callable[[int], str] | None) -> bool:
    ids = row["output_token_ids"]
    if row["finish_reason"] != "stop" or not ids or decode is None:
        return False
    return not (row["output_text"] or "").endswith(decode(ids[-1]))


def _completion_logprobs(row: dict[str, Any], decode: Callable[[int], str] | None) -> dict[str, Any] | None:  # fmt: skip
    lps = row.get("output_logprobs")
    if lps is None:
        return None
    ids = list(row["output_token_ids"])
    tops = row.get("top_logprobs") or [None] * len(lps)
    if _ends_in_eos(row, decode):
        ids, lps, tops = ids[:-1], lps[:-1], tops[:-1]
    tokens = [_token_entry(decode, t, lp)["token"] for t, lp in zip(ids, lps, strict=True)]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": lps, "text_offset": offsets,
            "top_logprobs": [{(decode(e["token_id"]) if decode else str(e["token_id"])): e["logprob"] for e in (top or [])} for top in tops]}  # fmt: skip


def export_openai_batch(run_path: str, output: str, errors: str | None = None) -> tuple[int, int]:
    """Write the run's rows as Batch API output (and its skipped rows as errors); the
    number of responses and of errors written."""
    run = RunDir(run_path)
    spec = run.job_spec()
    if spec.get("input", {}).get("format") != "openai-batch":
        raise ConfigError("run", run_path, "was not made from an openai-batch input (input.format: openai-batch)")  # fmt: skip
    out = Path(output)
    err = Path(errors) if errors else out.with_name(f"{out.stem}_errors{out.suffix or '.jsonl'}")
    from rollout.engines import engine_class

    fingerprint = run.manifest.engine
    decode = engine_class(str(fingerprint.get("engine"))).token_decoder(fingerprint)
    system_fingerprint = "fp_" + hashlib.sha256(determinism.canonical_json(fingerprint)).hexdigest()[:10]  # fmt: skip
    run_digest = run.manifest.run_digest or ""
    created = int((run.path / "manifest.json").stat().st_mtime)
    groups: dict[str, list[dict[str, Any]]] = {}
    order: list[str] = []
    for _, path in run.shard_files():
        names = pq.ParquetFile(path).schema_arrow.names
        table = pq.read_table(path, columns=[c for c in [*COLUMNS, "output_logprobs", "top_logprobs"] if c in names])  # fmt: skip
        for row in table.to_pylist():
            cid = row["example_id"]
            if cid not in groups:
                groups[cid] = []
                order.append(cid)
            groups[cid].append(row)
    lines = []
    for cid in order:
        rows = sorted(groups[cid], key=lambda r: r["sample_index"])
        params = json.loads(rows[0].get("request_params") or "{}")
        chat = params.get("url", "/v1/chat/completions") == "/v1/chat/completions"
        choices = []
        for r in rows:
            reason = r["finish_reason"]
            if chat:
                choices.append({"index": r["sample_index"], "finish_reason": reason,
                                "message": {"role": "assistant", "content": r["output_text"], "refusal": None},
                                "logprobs": _chat_logprobs(r, decode)})  # fmt: skip
            else:
                choices.append({"index": r["sample_index"], "finish_reason": reason, "text": r["output_text"],
                                "logprobs": _completion_logprobs(r, decode)})  # fmt: skip
        completion = sum(r["num_output_tokens"] for r in rows)
        prompt = rows[0]["num_prompt_tokens"]
        body = {"id": _id("chatcmpl-" if chat else "cmpl-", run_digest, cid),
                "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": params.get("model") or str(fingerprint.get("engine")), "choices": choices,
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
                "system_fingerprint": system_fingerprint}  # fmt: skip
        lines.append({"id": _id("batch_req_", run_digest, cid), "custom_id": cid,
                      "response": {"status_code": 200, "request_id": _id("req_", run_digest, cid), "body": body},
                      "error": None})  # fmt: skip
    failed = []
    errors_file = run.path / "errors.jsonl"
    if errors_file.exists():
        for line in errors_file.read_text(encoding="utf-8").splitlines():
            e = json.loads(line)
            failed.append({"id": _id("batch_req_", run_digest, e["example_id"]), "custom_id": e["example_id"],
                           "response": None, "error": {"code": f"rollout_{e.get('stage', 'input')}_error", "message": e["reason"]}})  # fmt: skip
    write_text_atomic(out, "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines))
    write_text_atomic(err, "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in failed))
    return len(lines), len(failed)
