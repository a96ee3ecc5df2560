"""The bad-input corpus: bad job specs and bad datasets, each with the error it must get.

A case builds its files under the service's data root and returns a job spec. `expect`
is where it is caught and how:
  ("submit", STATUS, pattern): SubmitJob fails with that gRPC status and message;
  ("run", pattern): the job is accepted (what is wrong is inside the data) and ends
  FAILED with that reason.
docs/security.md lists every case by name (a test checks it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

INVALID, DENIED = "INVALID_ARGUMENT", "PERMISSION_DENIED"


@dataclass
class Case:
    name: str
    build: Callable[[Path], dict]
    expect: tuple


def good_input(root: Path) -> Path:
    path = root / "good.parquet"
    if not path.exists():
        pq.write_table(pa.table({"id": ["a", "b", "c"], "q": ["One?", "Two?", "Three?"]}), path)
    return path


def spec(root: Path, name: str, **over) -> dict:
    data = {
        "input": {"path": str(good_input(root))},
        "prompt": {"column": "q"},
        "sampling": {"max_tokens": 4},
        "engine": {"name": "synthetic"},
        "output": str(root / "out" / name),
    }
    for key, value in over.items():
        node = data
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return data


def _file(root: Path, name: str, content: bytes) -> Path:
    path = root / name
    path.write_bytes(content)
    return path


def _jsonl(root: Path, name: str, rows: list) -> Path:
    return _file(root, name, "".join(json.dumps(r) + "\n" for r in rows).encode())


def _changing_schema(root: Path) -> Path:
    d = root / "changing"
    d.mkdir(exist_ok=True)
    pq.write_table(pa.table({"q": ["a", "b"]}), d / "part-0.parquet")
    pq.write_table(pa.table({"q": [1, 2]}), d / "part-1.parquet")
    return d


def _escape_link(root: Path) -> Path:
    link = root / "escape.parquet"
    if not link.is_symlink():
        os.symlink("/etc/hostname", link)
    return link


def _claims_10_gib(root: Path) -> Path:
    # A Parquet footer that says its metadata is 10 GiB long (truncated to the 4-byte field).
    return _file(
        root,
        "claims-10gib.parquet",
        b"PAR1" + b"\0" * 64 + (10 << 30).to_bytes(8, "little")[:4] + b"PAR1",
    )


def _arrow_stream_10_gib(root: Path) -> Path:
    # An Arrow IPC stream whose first message claims a 10 GiB metadata block.
    return _file(
        root,
        "claims-10gib.arrows",
        b"\xff\xff\xff\xff" + (0x7FFFFFF0).to_bytes(4, "little") + b"\0" * 32,
    )


CASES: list[Case] = [
    # -- the spec: types, ranges, unknown fields --------------------------------------------
    Case("temperature-not-a-number", lambda r: spec(r, "t1", sampling__temperature="hot"), ("submit", INVALID, r"sampling\.temperature")),
    Case("negative-temperature", lambda r: spec(r, "t2", sampling__temperature=-1), ("submit", INVALID, r"sampling\.temperature.*-1")),
    Case("top-p-out-of-range", lambda r: spec(r, "t3", sampling__top_p=1.5), ("submit", INVALID, r"sampling\.top_p.*1\.5")),
    Case("top-k-zero", lambda r: spec(r, "t4", sampling__top_k=0), ("submit", INVALID, r"sampling\.top_k")),
    Case("enormous-max-tokens", lambda r: spec(r, "t5", sampling__max_tokens=10**12), ("submit", INVALID, r"sampling\.max_tokens.*1048576")),
    Case("zero-max-tokens", lambda r: spec(r, "t6", sampling__max_tokens=0), ("submit", INVALID, r"sampling\.max_tokens")),
    Case("too-many-stop-strings", lambda r: spec(r, "t7", sampling__stop=["x"] * 17), ("submit", INVALID, r"sampling\.stop.*16")),
    Case("stop-string-too-long", lambda r: spec(r, "t8", sampling__stop=["x" * 300]), ("submit", INVALID, r"sampling\.stop")),
    Case("too-many-top-logprobs", lambda r: spec(r, "t9", sampling__top_logprobs=21), ("submit", INVALID, r"sampling\.top_logprobs")),
    Case("unknown-sampling-field", lambda r: spec(r, "t10", sampling__temprature=0.5), ("submit", INVALID, r"sampling\.temprature")),
    Case("unknown-top-level-field", lambda r: spec(r, "t11", shards=4), ("submit", INVALID, r"shards")),
    Case("n-zero", lambda r: spec(r, "t12", n=0), ("submit", INVALID, r"\bn\b")),
    Case("job-seed-over-uint64", lambda r: spec(r, "t13", job_seed=2**64), ("submit", INVALID, r"job_seed")),
    Case("shard-size-zero", lambda r: spec(r, "t14", shard_size=0), ("submit", INVALID, r"shard_size")),
    Case("actors-zero", lambda r: spec(r, "t15", pool__actors=0), ("submit", INVALID, r"pool\.actors")),
    Case("unknown-engine", lambda r: spec(r, "t16", engine__name="gpt5"), ("submit", INVALID, r"unknown engine 'gpt5'.*smollm2")),
    Case("bad-engine-option", lambda r: spec(r, "t17", engine__options={"vocab_size": "big"}), ("submit", INVALID, r"engine\.options\.vocab_size")),
    Case("two-prompt-sources", lambda r: spec(r, "t18", prompt={"column": "q", "template": "{q}"}), ("submit", INVALID, r"prompt")),
    Case("template-runs-no-code", lambda r: spec(r, "t19", prompt={"template": "{q.__class__.__mro__}"}), ("submit", INVALID, r"prompt\.template")),
    Case("so-args-on-an-engine-without-it", lambda r: spec(r, "t20", sampling__so_args={"schema_type": "regex", "schema": "a"}), ("submit", INVALID, r"so_args")),
    Case("unknown-format", lambda r: spec(r, "t21", input__format="xlsx"), ("submit", INVALID, r"input\.format")),
    # -- paths --------------------------------------------------------------------------------
    Case("path-traversal", lambda r: spec(r, "p1", input__path="../../etc/passwd"), ("submit", DENIED, r"input\.path.*outside the data roots")),
    Case("output-traversal", lambda r: spec(r, "p2", output="../elsewhere"), ("submit", DENIED, r"output.*outside the data roots")),
    Case("symlink-escape", lambda r: spec(r, "p3", input__path=str(_escape_link(r))), ("submit", DENIED, r"resolves to /etc/hostname")),
    Case("uri-input", lambda r: spec(r, "p4", input__path="s3://bucket/x.parquet"), ("submit", DENIED, r"URIs are not served")),
    Case("missing-input", lambda r: spec(r, "p5", input__path=str(r / "nope.parquet")), ("submit", INVALID, r"nope\.parquet")),
    Case("output-is-a-file", lambda r: spec(r, "p6", output=str(good_input(r))), ("submit", INVALID, r"output.*is a file")),
    Case("empty-directory-as-input", lambda r: (r / "emptydir").mkdir(exist_ok=True) or spec(r, "p7", input__path=str(r / "emptydir")), ("submit", INVALID, r"emptydir")),
    # -- the data -----------------------------------------------------------------------------
    Case("zero-row-dataset", lambda r: spec(r, "d1", input__path=str(_zero_rows(r))), ("run", r"has 0 rows")),
    Case("missing-column", lambda r: spec(r, "d2", prompt__column="question"), ("submit", INVALID, r"no column 'question'.*available columns: id, q")),
    Case("prompt-not-a-string", lambda r: spec(r, "d3", input__path=str(_jsonl(r, "ints.jsonl", [{"q": 5}, {"q": 6}]))), ("submit", INVALID, r"prompt\.column.*int64, not text")),
    Case("null-prompt", lambda r: spec(r, "d4", input__path=str(_jsonl(r, "nulls.jsonl", [{"q": "ok"}, {"q": None}]))), ("run", r"row 1.*is null")),
    Case("nested-null-in-messages", lambda r: spec(r, "d5", prompt={"messages_column": "m"}, input__path=str(_jsonl(r, "msgs.jsonl", [{"m": [{"role": "user", "content": None}]}]))), ("run", r"message 0 must be \{role: string, content: string\}")),
    Case("messages-not-a-list", lambda r: spec(r, "d6", prompt={"messages_column": "q"}), ("submit", INVALID, r"messages_column.*not a list")),
    Case("non-utf8-text", lambda r: spec(r, "d7", input__path=str(_file(r, "latin1.jsonl", b'{"q": "ok"}\n{"q": "caf\xe9"}\n'))), ("run", r"latin1\.jsonl.*not UTF-8: byte 0xe9")),
    Case("malformed-jsonl", lambda r: spec(r, "d8", input__path=str(_file(r, "broken.jsonl", b'{"q": "ok"}\n{"q": \n'))), ("submit", INVALID, r"broken\.jsonl")),
    Case("schema-changes-between-files", lambda r: spec(r, "d9", input__path=str(_changing_schema(r))), ("submit", INVALID, r"part-1\.parquet.*column 'q'")),
    Case("parquet-claims-10-gib", lambda r: spec(r, "d10", input__path=str(_claims_10_gib(r))), ("submit", INVALID, r"claims-10gib\.parquet.*not a readable Parquet")),
    Case("arrow-stream-claims-10-gib", lambda r: spec(r, "d11", input__path=str(_arrow_stream_10_gib(r)), input__format="arrow"), ("submit", INVALID, r"claims-10gib\.arrows")),
    Case("duplicate-ids", lambda r: spec(r, "d12", id_column="id", input__path=str(_jsonl(r, "dups.jsonl", [{"id": "x", "q": "a"}, {"id": "x", "q": "b"}]))), ("run", r"'x' appears at rows 0 and 1")),
    Case("null-id", lambda r: spec(r, "d13", id_column="id", input__path=str(_jsonl(r, "nullid.jsonl", [{"id": "x", "q": "a"}, {"id": None, "q": "b"}]))), ("run", r"row 1.*id column 'id' is null")),
]  # fmt: skip


def _zero_rows(root: Path) -> Path:
    path = root / "zero.parquet"
    pq.write_table(pa.table({"q": pa.array([], pa.string())}), path)
    return path
