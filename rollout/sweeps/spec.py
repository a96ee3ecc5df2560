"""The sweep spec: a base job spec and the axes (or an explicit list) that make its cells.

    base: configs/eval-math.yaml     # a job spec file (relative to the sweep file) or inline
    axes:                            # the full product, in the order written
      input.path: [data/a.jsonl, data/b.jsonl]
      sampling.temperature: [0.2, 0.8]
      n: [2, 4]
    cells:                           # or instead: an explicit list of settings
      - {sampling.temperature: 0.2, n: 2}
    overrides:                       # per-cell overrides, for the cells whose settings match
      - where: {input.path: data/b.jsonl}
        set: {prompt.template: "Q: {question}\\nA:"}
    cache: null                      # default: <output>/cache
    baseline: null                   # the cell the report compares the others with

A cell's id is made of its settings (`temperature=0.2,n=2`), so it names the same cell
whatever the order of the axes' values; a cell's job is the base with its settings and
overrides applied at their dotted paths.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rollout import determinism
from rollout.errors import ConfigError, config_error_from_validation
from rollout.jobs.spec import JobSpec, parse_job_spec

MAX_CELLS = 1000


class Override(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    where: dict[str, Any] = Field(default_factory=dict, description="Settings a cell must have (all of them); empty: every cell.")  # fmt: skip
    set: dict[str, Any] = Field(description="Dotted paths and the values they take in those cells.")  # fmt: skip


class SweepSpec(BaseModel):
    """A sweep (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("sweep", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", description="A name for reports.")  # fmt: skip
    base: str | dict[str, Any] = Field(description="The base job spec: a file (relative to the sweep file) or inline.")  # fmt: skip
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="Dotted path -> values; the cells are their full product.")  # fmt: skip
    cells: list[dict[str, Any]] | None = Field(None, description="An explicit list of cells (dotted path -> value), instead of axes.")  # fmt: skip
    overrides: list[Override] = Field(default_factory=list)
    cache: str | bool | None = Field(None, description="The generation cache the cells share; default (null or true): <output>/cache; false: none.")  # fmt: skip
    baseline: str | None = Field(None, description="The cell id the report compares every other cell with.")  # fmt: skip

    @model_validator(mode="after")
    def _cells_or_axes(self) -> SweepSpec:
        if (self.cells is None) == (not self.axes):
            raise ValueError("give either axes (a grid) or cells (a list), one of them")
        for path, values in self.axes.items():
            if not values:
                raise ValueError(f"axes.{path} has no values")
        return self


@dataclass
class Cell:
    cell_id: str
    settings: dict[str, Any]  # dotted path -> value, the cell's own
    job: dict[str, Any]  # the job spec (without output and cache, which the runner sets)


def load_sweep(path: str | Path) -> tuple[SweepSpec, dict[str, Any]]:
    """The sweep spec of a YAML file and its base job spec, read."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError("sweep", str(p), f"cannot be read as YAML: {exc}") from None
    spec = parse_sweep(data, str(p))
    return spec, base_of(spec, p.parent)


def parse_sweep(data: Any, source: str = "sweep") -> SweepSpec:
    if not isinstance(data, dict):
        raise ConfigError(source, type(data).__name__, "must be a mapping of fields")
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_validation(exc, prefix="sweep") from None


def base_of(spec: SweepSpec, folder: Path) -> dict[str, Any]:
    if isinstance(spec.base, dict):
        return dict(spec.base)
    path = (folder / spec.base) if not Path(spec.base).is_absolute() else Path(spec.base)
    try:
        base = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError("sweep.base", str(path), f"cannot be read: {exc}") from None
    if not isinstance(base, dict):
        raise ConfigError("sweep.base", str(path), "must hold a job spec (a mapping)")
    return base


def set_path(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of `data` with `dotted` (a.b.c) set to `value`."""
    out = dict(data)
    node = out
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.get(key)
        child = dict(child) if isinstance(child, dict) else {}
        node[key] = child
        node = child
    node[leaf] = value
    return out


def _short(value: Any) -> str:
    if isinstance(value, str) and ("/" in value or "." in value) and Path(value).name:
        value = Path(value).stem if "/" in value else value
    text = value if isinstance(value, str) else determinism.canonical_json(value).decode()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:40]


def cell_id(settings: dict[str, Any]) -> str:
    """A readable id made of the settings (last path part = value), with a hash of the full
    settings when the readable part would be ambiguous or long."""
    parts = [f"{k.rsplit('.', 1)[-1]}={_short(v)}" for k, v in sorted(settings.items())]
    readable = ",".join(parts) or "base"
    digest = hashlib.sha256(determinism.canonical_json(settings)).hexdigest()[:8]
    return readable if len(readable) <= 100 else f"{readable[:90]}~{digest}"


def expand(spec: SweepSpec, base: dict[str, Any]) -> list[Cell]:
    """The sweep's cells, each with its job spec validated (ConfigError naming the cell)."""
    if spec.cells is not None:
        settings_list = [dict(c) for c in spec.cells]
    else:
        paths = list(spec.axes)
        settings_list = [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*spec.axes.values())]  # fmt: skip
    if len(settings_list) > MAX_CELLS:
        raise ConfigError("sweep", len(settings_list), f"makes {len(settings_list)} cells; at most {MAX_CELLS}")  # fmt: skip
    cells, seen = [], {}
    for settings in settings_list:
        job = {k: v for k, v in base.items() if k not in ("output", "cache")}
        for path, value in settings.items():
            job = set_path(job, path, value)
        for o in spec.overrides:
            if all(settings.get(k) == v for k, v in o.where.items()):
                for path, value in o.set.items():
                    job = set_path(job, path, value)
        cid = cell_id(settings)
        if cid in seen:
            raise ConfigError("sweep.cells", settings, f"is the same cell as {seen[cid]}")
        seen[cid] = settings
        try:
            parse_job_spec(job | {"output": "cell"}, source=f"sweep cell {cid}")
        except ConfigError as exc:
            raise ConfigError(f"sweep cell {cid}: {exc.parameter}", exc.value, exc.reason) from None  # fmt: skip
        cells.append(Cell(cid, settings, job))
    if spec.baseline is not None and spec.baseline not in seen:
        raise ConfigError("sweep.baseline", spec.baseline, f"is not a cell; the cells are: {', '.join(seen)}")  # fmt: skip
    return cells


def cache_dir(spec: SweepSpec, output: Path) -> str | None:
    """The cache the cells share: the spec's, <output>/cache by default, None with `cache: false`."""
    if spec.cache is False:
        return None
    if spec.cache is None or spec.cache is True:
        return str(output / "cache")
    return spec.cache


def cell_job_data(cell: Cell, output: Path, cache: str | None) -> dict[str, Any]:
    """The cell's job spec with its run folder (<output>/cells/<cell id>) and the shared cache."""
    return cell.job | {"output": str(output / "cells" / cell.cell_id), "cache": cache}


def cell_job(cell: Cell, output: Path, cache: str | None) -> JobSpec:
    return parse_job_spec(cell_job_data(cell, output, cache))
