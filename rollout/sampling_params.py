"""Sampling parameters: the per-request knobs, validated at the boundary."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Request-size limits (a spec must not be able to ask for unbounded work or memory).
MAX_TOKENS_LIMIT = 1 << 20
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_TOP_LOGPROBS = 1000  # DeepInfer's limit; each engine may allow fewer (engines.MAX_TOP_LOGPROBS)


MAX_SCHEMA_CHARS = 64 * 1024


class StructuredOutput(BaseModel):
    """DeepInfer's `so_args`: what the output must match."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True,
        serialize_by_alias=True,
    )  # fmt: skip

    schema_type: Literal["regex", "json", "ebnf"] = Field(description="How `schema` is read.")
    schema_: str = Field(
        alias="schema",
        max_length=MAX_SCHEMA_CHARS,
        description="The regex, JSON schema (as JSON text) or EBNF grammar.",
    )

    def as_so_args(self) -> dict[str, str]:
        return {"schema_type": self.schema_type, "schema": self.schema_}


class SamplingParams(BaseModel):
    """How one request is sampled. The same fields and meanings as DeepInfer's and vLLM's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(
        1.0,
        description="Softmax temperature; 0 means greedy (the most likely token, lowest id on ties).",
    )
    top_p: float = Field(
        1.0,
        description="Nucleus sampling: keep the smallest prefix of tokens (by probability) whose mass reaches top_p; in (0, 1].",
    )
    top_k: int = Field(-1, description="Keep the k most likely tokens; -1 keeps all.")
    max_tokens: int = Field(16, description="The most tokens to generate (>= 1).")
    ignore_eos: bool = Field(
        False,
        description="Keep generating past the model's end-of-sequence token (stop_token_ids still stop).",
    )
    stop: list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS)]] = Field(
        default_factory=list,
        max_length=MAX_STOP_STRINGS,
        description="Stop strings: the output text ends at the first one (excluded unless include_stop_str_in_output); finish_reason 'stop'.",
    )
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="Token ids that end the output (kept in output_token_ids), as EOS does.",
    )
    include_stop_str_in_output: bool = Field(
        False, description="Keep the matched stop string at the end of output_text."
    )
    logprobs: bool = Field(
        False,
        description="Return the log-probability of each sampled token (under the temperature-scaled distribution).",
    )
    top_logprobs: int = Field(
        0,
        description=f"Also return the top-N tokens and log-probabilities per position (0..{MAX_TOP_LOGPROBS}).",
    )
    truncate_prompt_tokens: int | None = Field(
        None,
        description="Keep only the last N prompt tokens; without it, a prompt too long for the context is an error.",
    )

    so_args: StructuredOutput | None = Field(
        None,
        description="Structured output: constrain the output to a regex, JSON schema or EBNF "
        "grammar (DeepInfer's so_args; engines without it refuse the job).",
    )

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, v: float) -> float:
        if not v >= 0.0 or v == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {v}")
        return v

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float) -> float:
        if not 0.0 < v <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {v}")
        return v

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {v}")
        return v

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, v: int) -> int:
        if not 1 <= v <= MAX_TOKENS_LIMIT:
            raise ValueError(f"max_tokens must be in [1, {MAX_TOKENS_LIMIT}], got {v}")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, v: int) -> int:
        if not 0 <= v <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {v}")
        return v

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _truncate(cls, v: int | None) -> int | None:
        if v is not None and v < 1:
            raise ValueError(f"truncate_prompt_tokens must be >= 1 or null, got {v}")
        return v

    def config_view(self) -> dict:
        """What `config_hash` covers. `so_args` appears only when set, so that runs without
        structured output keep the config_hash they had before the field existed."""
        data = self.model_dump(by_alias=True)
        if data["so_args"] is None:
            del data["so_args"]
        return data

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
