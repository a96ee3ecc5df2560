"""`rollout score RUN --scoring S.yaml --output DIR`: new or changed score columns for a
finished run, without generating anything.

The scoring of the new run is the generation run's, with S's entries replacing those of
the same name where they stand and the others added after them; only S's entries are computed (the others are
copied). Scorers read the input columns the run carried (`input_<name>`), or, for a column
it did not carry, the job's input itself, once its content is checked against the
fingerprint the run recorded. DIR is a run directory like any other (manifest, job.json,
data/, scores.json) whose manifest names the run it came from (`source_run`); its rows
and run digest are the generation run's, its config_hash and score digest its own.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from rollout import determinism
from rollout.audit.runs import RunDir
from rollout.data.columns import list_slices
from rollout.data.sink import file_sha256, fsync_dir, write_atomic
from rollout.data.sources import Source
from rollout.errors import ConfigError, InputError
from rollout.jobs.spec import JobSpec, parse_job_spec
from rollout.runtime.manifest import JOB, Manifest, write_json_atomic
from rollout.runtime.stages.score import build_scorers, score_columns
from rollout.scoring.base import ScoreRow
from rollout.scoring.summary import SCORES, run_scores

STAGING = ".incomplete"


def load_scoring(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a scoring file: a list of entries, or a mapping with `scoring:`."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError("--scoring", str(p), f"cannot be read as YAML: {exc}") from None
    if isinstance(data, dict) and set(data) == {"scoring"}:
        data = data["scoring"]
    if not isinstance(data, list) or not data or not all(isinstance(e, dict) for e in data):
        raise ConfigError("--scoring", str(p), "must hold a non-empty list of scoring entries (or scoring: [...])")  # fmt: skip
    return data


def rescore(run_path: str, scoring: list[dict[str, Any]], output: str,
            progress: Callable[[int, int], None] | None = None) -> Manifest:  # fmt: skip
    """Score the finished run at `run_path` with `scoring` into the new run `output`."""
    run = RunDir(run_path)
    out = Path(output).expanduser().resolve()
    if out == run.path or run.path in out.parents:
        raise ConfigError("--output", str(out), "lies inside the run being scored; choose another folder")  # fmt: skip
    if out.exists() and any(out.iterdir()):
        raise ConfigError("--output", str(out), "is not empty; choose a new folder")
    old = run.job_spec()
    names = [e.get("name") for e in scoring]
    given = {e.get("name"): e for e in scoring}
    before = old.get("scoring", [])
    merged = [given.get(e.get("name"), e) for e in before]  # replaced where they stand
    merged += [e for e in scoring if e.get("name") not in {b.get("name") for b in before}]
    spec = parse_job_spec(old | {"scoring": merged, "output": str(out)}, source="--scoring")
    fresh = JobSpec.model_validate(old | {"scoring": scoring, "output": str(out)})
    scorers = build_scorers(fresh)
    input_rows = _input_reader(run, spec, fresh, scorers)
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    manifest = run.manifest
    source_digest, source_config = manifest.run_digest, manifest.config_hash
    shards = list(run.shard_files())
    for done, (shard_id, path) in enumerate(shards):
        table = pq.read_table(path)
        keep = [n for n in table.schema.names if not (n.startswith("score_") and _entry_of(n, names))]  # fmt: skip
        table = table.select(keep)
        rows = _score_rows(table, input_rows)
        for name, column in score_columns(fresh, scorers, rows, f"{path.name} of {run.label}").items():  # fmt: skip
            table = table.append_column(pa.field(name, column.type), column)
        table = table.select(_ordered(table.schema.names, spec))
        write_atomic(table, staging / path.name)
        entry = next(e for e in manifest.shards if e.shard_id == shard_id)
        entry.file_sha256 = file_sha256(staging / path.name)
        if progress:
            progress(done + 1, len(shards))
    for scorer in scorers:
        scorer.close()
    staging.rename(out / "data")
    fsync_dir(out)
    config = {k: v for k, v in manifest.config.items() if k not in ("scoring", "teacher_forcing")}
    config |= spec.scoring_view()
    manifest.config = config
    manifest.config_hash = determinism.config_hash(config)
    manifest.score_digest, scores = run_scores(spec, [out / "data" / e.file for e in manifest.shards])  # fmt: skip
    write_json_atomic(out / SCORES, scores)
    write_json_atomic(out / JOB, spec.model_dump(mode="json"))
    manifest.source_run = {"path": str(run.path), "run_digest": source_digest,
                           "config_hash": source_config}  # fmt: skip
    manifest.save(out)  # last: the run is complete once it exists
    return manifest


def _entry_of(column: str, names: list[str]) -> bool:
    """Whether a score column belongs to one of the entries being recomputed."""
    return any(column == f"score_{n}" or column.startswith(f"score_{n}_") for n in names)


def _ordered(columns: list[str], spec: JobSpec) -> list[str]:
    """Generation columns first, then score columns in the order of the scoring entries."""
    base = [c for c in columns if not c.startswith("score_")]
    scores = []
    for e in spec.scoring:
        scores += [c for c in columns if c == f"score_{e.name}" or c.startswith(f"score_{e.name}_")]
    return base + [c for c in scores if c in columns]


def _input_reader(run: RunDir, spec: JobSpec, fresh: JobSpec, scorers: list) -> Callable[[int, int], list[dict]] | None:  # fmt: skip
    """Rows [start, end) of the job's input when a scorer needs a column the run did not
    carry; None when the carried columns suffice."""
    needed = set()
    for entry, scorer in zip(fresh.scoring, scorers, strict=True):
        needed |= set(scorer.columns()) | set(entry.columns)
    carried = set(spec.carry_columns)
    missing = sorted(needed - carried)
    if not missing:
        return None
    source = Source(spec.input.path, spec.input.format, spec.input.split)
    recorded = run.manifest.config.get("input", {}).get("fingerprint")
    if source.fingerprint() != recorded:
        raise InputError(
            f"run {run.label!r}",
            f"a scorer reads column(s) {', '.join(missing)}, which the run did not carry, and its "
            f"input {spec.input.path!r} no longer holds what the run read; carry them next time",
        )

    def read(start: int, end: int) -> list[dict]:
        return pa.Table.from_batches(list(source.read(start, end, missing))).to_pylist()

    return read


def _score_rows(table: pa.Table, input_rows: Callable[[int, int], list[dict]] | None) -> list[ScoreRow]:  # fmt: skip
    cols = table.to_pydict()
    n = table.num_rows
    counts = np.diff(list_slices(table.column("output_token_ids").combine_chunks())[0]).tolist()
    carried = {k[len("input_") :]: v for k, v in cols.items() if k.startswith("input_")}
    extra: list[dict] = [{}] * n
    if input_rows is not None and n:
        lo, hi = min(cols["row_index"]), max(cols["row_index"]) + 1
        read = input_rows(lo, hi)
        extra = [read[r - lo] for r in cols["row_index"]]
    return [
        ScoreRow(output=cols["output_text"][i] or "", prompt=cols["prompt"][i] or "",
                 columns={k: v[i] for k, v in carried.items()} | extra[i],
                 finish_reason=cols["finish_reason"][i], num_output_tokens=counts[i],
                 example_id=cols["example_id"][i], sample_index=cols["sample_index"][i])
        for i in range(n)
    ]  # fmt: skip
