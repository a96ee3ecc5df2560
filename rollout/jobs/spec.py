"""The job spec: a pydantic model with `extra="forbid"`, loaded from YAML or JSON.

Everything here that decides the output goes into `config_hash` (see `config_view`);
where and how the job runs (output path, actors, shard size, resources) does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollout.determinism import UINT64_MAX
from rollout.errors import ConfigError, config_error_from_validation
from rollout.sampling_params import SamplingParams

InputFormat = Literal["auto", "parquet", "arrow", "jsonl", "csv", "hf"]
MAX_SAMPLES_PER_PROMPT = 4096


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(_Strict):
    """Where the prompts come from."""

    path: str = Field(
        description="A file, a directory, a glob, or a URI pyarrow can open (s3://, gs://, file://)."
    )
    format: InputFormat = Field(
        "auto",
        description="File format; auto detects it from the extension (or an HF `save_to_disk` folder).",
    )
    split: str | None = Field(
        None,
        description="For a Hugging Face DatasetDict saved with save_to_disk: the split to read.",
    )


class PromptSpec(_Strict):
    """How a row becomes the prompt fed to the engine. Exactly one of the three sources."""

    column: str | None = Field(None, description="A text column holding the prompt.")
    messages_column: str | None = Field(
        None,
        description="A column of chat messages (a list of {role, content}), rendered with the engine's chat template.",
    )
    template: str | None = Field(
        None,
        description='A template over columns, e.g. "Question: {question}\\nAnswer:" (str.format fields only).',
    )
    chat: bool = Field(
        False,
        description="Render the text (from column or template) as one user message with the chat template.",
    )
    system: str | None = Field(None, description="With chat: a system message put first.")
    on_empty: Literal["error", "skip"] = Field(
        "error",
        description="A null or empty prompt: 'error' stops the job naming the row; 'skip' leaves the row out and lists it in errors.jsonl.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> PromptSpec:
        chosen = [n for n in ("column", "messages_column", "template") if getattr(self, n)]
        if len(chosen) != 1:
            raise ValueError(
                f"exactly one of column, messages_column, template must be set, got {chosen or 'none'}"
            )
        if self.messages_column and (self.chat or self.system):
            raise ValueError(
                "chat and system apply to column or template prompts, not messages_column"
            )
        if self.system and not self.chat:
            raise ValueError("system needs chat: true")
        return self


class EngineSpec(_Strict):
    name: str = Field("smollm2", description="Engine name (see rollout.engines.ENGINES).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Engine options, validated by the engine."
    )


class PoolSpec(_Strict):
    """Where the job runs: none of this changes the output."""

    actors: int = Field(1, ge=1, le=100_000, description="Number of engine actors.")
    cpus_per_actor: float = Field(1.0, gt=0, description="CPUs each actor reserves in Ray.")
    gpus_per_actor: float = Field(0.0, ge=0, description="GPUs each actor reserves in Ray.")
    max_shard_retries: int = Field(
        3, ge=0, description="Attempts after the first for a shard whose actor died."
    )
    shards_in_flight_per_actor: int = Field(
        2, ge=1, le=64, description="Shards queued on each actor at once."
    )
    max_actor_restarts: int | None = Field(
        None,
        ge=0,
        description="Dead actors replaced in one run before the job fails (so that a broken "
        "node or engine cannot make the pool thrash through cold starts); default: 2 per "
        "actor, at least 3.",
    )

    backup_after: float | None = Field(
        3.0,
        gt=1,
        description="Straggler handling: a shard running longer than this many times the "
        "median shard time gets a backup copy on an idle actor; the first copy to finish is "
        "kept (both write identical bytes). null: never.",
    )
    backup_min_s: float = Field(
        30.0, ge=0, description="No backup copy for a shard that has run less than this."
    )
    start_timeout_s: float = Field(
        1800.0,
        gt=0,
        le=86_400,
        description="How long the engine actors may take to start (Ray resources, engine load) "
        "before the job fails; a cancel takes effect while they start.",
    )

    def restart_budget(self) -> int:
        if self.max_actor_restarts is not None:
            return self.max_actor_restarts
        return max(3, 2 * self.actors)


class JobSpec(_Strict):
    """A rollout job."""

    input: InputSpec
    prompt: PromptSpec
    sampling: SamplingParams = Field(
        default_factory=SamplingParams, description="How each sample is drawn."
    )
    n: int = Field(1, ge=1, le=MAX_SAMPLES_PER_PROMPT, description="Samples per prompt.")
    job_seed: int = Field(
        0,
        description="The job's seed, an unsigned 64-bit integer (DETERMINISM.md); also as a "
        "decimal string, which carries it exactly where numbers are doubles (gRPC Struct).",
    )
    id_column: str | None = Field(
        None, description="A column of unique example ids; default: the row index."
    )
    carry_columns: list[str] = Field(
        default_factory=list, description="Input columns copied into every output row."
    )
    engine: EngineSpec = Field(default_factory=EngineSpec)
    pool: PoolSpec = Field(default_factory=PoolSpec)
    shard_size: int = Field(
        64, ge=1, le=10_000_000, description="Input rows per shard (one Parquet file each)."
    )
    output: str = Field("runs/out", description="The run's output directory.")

    @field_validator("job_seed", mode="before")
    @classmethod
    def _exact_seed(cls, v: Any) -> Any:
        if isinstance(v, str) and v.isdigit():
            return int(v)
        if isinstance(v, float) and (not v.is_integer() or abs(v) > 2**53):
            raise ValueError(
                f"job_seed arrived as the number {v!r}, which cannot hold a seed exactly above "
                "2^53 (a JSON or gRPC Struct number is a double): send it as a decimal string"
            )
        return v

    @field_validator("job_seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        if not 0 <= v <= UINT64_MAX:
            raise ValueError(f"job_seed must be an unsigned 64-bit integer, got {v}")
        return v

    @model_validator(mode="after")
    def _structured_output(self) -> JobSpec:
        from rollout.engines import STRUCTURED_OUTPUT, check_top_logprobs

        if self.sampling.so_args is not None and self.engine.name not in STRUCTURED_OUTPUT:
            raise ValueError(
                f"sampling.so_args (structured output) needs an engine that supports it "
                f"({', '.join(sorted(STRUCTURED_OUTPUT))}); engine {self.engine.name!r} does not"
            )
        check_top_logprobs(self.engine.name, self.sampling.top_logprobs)
        return self

    def config_view(
        self, input_fingerprint: dict[str, Any], engine_fingerprint: dict[str, Any]
    ) -> dict[str, Any]:
        """Everything that decides the output: what `config_hash` is computed over."""
        return {
            "version": "rollout-config-v1",
            # The fingerprint names the format as resolved, so "auto" and an explicit
            # format that reads the same bytes give the same hash.
            "input": {"split": self.input.split, "fingerprint": input_fingerprint},
            "prompt": self.prompt.model_dump(),
            "sampling": self.sampling.config_view(),
            "n": self.n,
            "job_seed": self.job_seed,
            "id_column": self.id_column,
            "carry_columns": list(self.carry_columns),
            "engine": engine_fingerprint,
        }


def parse_job_spec(data: Any, source: str = "job spec") -> JobSpec:
    if not isinstance(data, dict):
        raise ConfigError(
            source, type(data).__name__, f"must be a mapping of fields, got {type(data).__name__}"
        )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_validation(exc) from None


def load_job_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> JobSpec:
    """Read a job spec from YAML or JSON; `overrides` are dotted paths (e.g. "pool.actors")."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("config", str(p), f"cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "config", str(p), f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise ConfigError(
            "config", str(p), f"is not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}"
        ) from None
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return parse_job_spec(data, source=str(p))


def job_spec_json_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()
