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

InputFormat = Literal["auto", "parquet", "arrow", "jsonl", "csv", "hf", "openai-batch"]
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
        description="File format; auto detects it from the extension (or an HF `save_to_disk` folder). openai-batch: OpenAI Batch API request files (JSONL); the job then needs no prompt section.",
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


SCORE_NAME = r"^[a-z][a-z0-9_]{0,47}$"


class ScorerEntry(BaseModel):
    """One entry of `scoring:`: a scorer and its options (the entry's other fields), writing
    the column score_<name> (and score_<name>_detail where the scorer says more)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(pattern=SCORE_NAME, description="The score's name: its column is score_<name>.")  # fmt: skip
    scorer: str = Field(description="A built-in scorer (exact_match, regex_match, math_equal, multiple_choice, json_schema, length, format, code_tests) or a user scorer as module:function.")  # fmt: skip
    advantages: bool = Field(False, description="Add the group columns over an example's n samples: score_<name>_group_mean, score_<name>_group_std and score_<name>_advantage ((score - mean) / (std + eps), as GRPO).")  # fmt: skip
    eps: float = Field(1e-4, gt=0, description="The eps of the advantage's denominator.")
    pass_at_k: list[int] = Field(default_factory=list, description="k values reported in scores.json as pass@k (a sample passes when its score >= pass_threshold); each at most n.")  # fmt: skip
    pass_threshold: float = Field(1.0, description="The score at or above which a sample passes, for pass@k.")  # fmt: skip
    columns: list[str] = Field(default_factory=list, description="Input columns a user scorer reads (built-in scorers name their own).")  # fmt: skip

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    @model_validator(mode="after")
    def _known(self) -> ScorerEntry:
        from rollout.scoring.registry import build, is_import_path

        if not is_import_path(self.scorer):  # user scorers are checked where they may be imported
            build(self.name, self.scorer, self.options).close()
        return self


class TeacherForcingSpec(_Strict):
    """Score given completions instead of generating: the engine records the logprob of
    each completion token (the job's sampling temperature applies; logprobs are on)."""

    completion_column: str | None = Field(None, description="A text column holding the completion, tokenized by the engine.")  # fmt: skip
    completion_ids_column: str | None = Field(None, description="A column of completion token ids, used as given (a previous run's output_token_ids).")  # fmt: skip
    prompt_ids_column: str | None = Field(None, description="A column of prompt token ids, used as given instead of rendering `prompt` (a previous run's prompt_token_ids).")  # fmt: skip

    @model_validator(mode="after")
    def _one(self) -> TeacherForcingSpec:
        if (self.completion_column is None) == (self.completion_ids_column is None):
            raise ValueError("exactly one of completion_column, completion_ids_column must be set")
        return self


class JobSpec(_Strict):
    """A rollout job."""

    input: InputSpec
    prompt: PromptSpec | None = Field(None, description="How a row becomes its prompt; required unless teacher_forcing.prompt_ids_column gives prompt token ids.")  # fmt: skip
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
    cache: str | None = Field(None, description="A generation cache directory (docs/cache.md): rows it holds are not generated again, rows generated are added. Not part of config_hash.")  # fmt: skip
    scoring: list[ScorerEntry] = Field(default_factory=list, description="Scores computed for every output row after generation, on the engine actors (docs/scoring.md).")  # fmt: skip
    teacher_forcing: TeacherForcingSpec | None = Field(None, description="Record the logprobs of given completions instead of generating (docs/scoring.md).")  # fmt: skip

    on_error: Literal["fail", "skip"] = Field("fail", description="An error of one row (a prompt longer than the context, an engine-side rejection, a scorer's error): fail stops the job naming the example; skip leaves the row out, lists it in errors.jsonl with its stage and reason, and counts it.")  # fmt: skip

    @model_validator(mode="before")
    @classmethod
    def _openai_batch_ids(cls, data: Any) -> Any:
        inp = data.get("input") if isinstance(data, dict) else None
        if (
            isinstance(inp, dict)
            and inp.get("format") == "openai-batch"
            and "id_column" not in data
        ):
            data = {**data, "id_column": "custom_id"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _forcing_records_logprobs(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("teacher_forcing"):
            sampling = data.get("sampling")
            if sampling is None or (isinstance(sampling, dict) and "logprobs" not in sampling):
                data = {**data, "sampling": {**(sampling or {}), "logprobs": True}}
        return data

    @model_validator(mode="after")
    def _scoring_and_forcing(self) -> JobSpec:
        names = [e.name for e in self.scoring]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup:
            raise ValueError(f"scoring: the name {dup!r} is used twice; each score needs its own column")  # fmt: skip
        for e in self.scoring:
            big = [k for k in e.pass_at_k if not 1 <= k <= self.n]
            if big:
                raise ValueError(f"scoring.{e.name}.pass_at_k: k must be in [1, n = {self.n}], got {big[0]}")  # fmt: skip
        tf = self.teacher_forcing
        if tf is not None:
            if self.n != 1:
                raise ValueError(f"teacher_forcing scores one given completion per row: n must be 1, got {self.n}")  # fmt: skip
            if not self.sampling.logprobs:
                raise ValueError("teacher_forcing records logprobs: sampling.logprobs cannot be false")  # fmt: skip
        batch = self.input.format == "openai-batch"
        if batch and self.prompt is not None:
            raise ValueError("prompt: an openai-batch input carries its own messages or prompt; remove the prompt section")  # fmt: skip
        if batch and self.id_column != "custom_id":
            raise ValueError("id_column: an openai-batch input is keyed by custom_id")
        if self.prompt is None and not batch and (tf is None or tf.prompt_ids_column is None):
            raise ValueError("prompt is required (only teacher_forcing.prompt_ids_column or an openai-batch input can stand in for it)")  # fmt: skip
        return self

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
        return (
            {
                "version": "rollout-config-v1",
                # The fingerprint names the format as resolved, so "auto" and an explicit
                # format that reads the same bytes give the same hash.
                "input": {"split": self.input.split, "fingerprint": input_fingerprint},
                "prompt": None if self.prompt is None else self.prompt.model_dump(),
                "sampling": self.sampling.config_view(),
                "n": self.n,
                "job_seed": self.job_seed,
                "id_column": self.id_column,
                "carry_columns": list(self.carry_columns),
                "engine": engine_fingerprint,
            }
            | self.scoring_view()
            | ({"on_error": "skip"} if self.on_error == "skip" else {})
        )

    def scoring_view(self) -> dict[str, Any]:
        """The scoring and teacher forcing settings with each scorer's version (only when set,
        so that the config_hash of a job without them is as before)."""
        from rollout.scoring.registry import scorer_class

        view: dict[str, Any] = {}
        if self.scoring:
            view["scoring"] = [
                e.model_dump() | {"version": scorer_class(e.scorer, f"scoring.{e.name}.scorer").version}
                for e in self.scoring
            ]  # fmt: skip
        if self.teacher_forcing is not None:
            view["teacher_forcing"] = self.teacher_forcing.model_dump()
        return view


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
