"""The engine interface every backend implements (smollm2, synthetic, deepinfer)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from rollout.determinism import FinishReason
from rollout.errors import ConfigError, InputError
from rollout.sampling_params import SamplingParams


@dataclass(frozen=True)
class GenerationRequest:
    """One sequence to generate: tokens in, its own sampling parameters and seed."""

    request_id: str
    prompt_token_ids: Sequence[int]
    params: SamplingParams
    seq_seed: int
    # Teacher forcing: the completion is given; the engine records the logprob of each of
    # its tokens after the prompt and the tokens before it (as a draw of that token would
    # have recorded it), finish_reason "length". None: generate.
    forced_output: Sequence[int] | None = None


@dataclass
class GenerationResult:
    """What an engine produced for one request.

    `prompt_token_ids` are the tokens actually fed (after any truncation asked for):
    `prompt_hash` is computed over them. `output_token_ids` include the token that
    ended the sequence (EOS, a stop token, or the token that completed a stop string).
    """

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_text: str
    finish_reason: FinishReason
    output_logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = field(default=None)


@dataclass
class GenerationBatch:
    """The results of one generate call as columns, in request order: what a shard writes.

    Token ids and logprobs are Arrow list arrays (one flat buffer and offsets), so an engine
    that makes them as arrays hands them on without a Python object per token.
    `output_logprobs` is null for a request that did not ask for logprobs, and None when
    none did; so is each entry of `top_logprobs`.
    """

    request_ids: list[str]
    prompt_token_ids: list[list[int]]
    output_token_ids: pa.ListArray  # list<int32>
    output_text: pa.Array | pa.ChunkedArray  # string
    finish_reason: list[FinishReason]
    output_logprobs: pa.ListArray | None = None  # list<float32>
    top_logprobs: list[list[list[tuple[int, float]]] | None] | None = None

    @classmethod
    def from_results(cls, results: Sequence[GenerationResult]) -> GenerationBatch:
        lps = [r.output_logprobs for r in results]
        tops = [r.top_logprobs for r in results]
        return cls(
            request_ids=[r.request_id for r in results],
            prompt_token_ids=[r.prompt_token_ids for r in results],
            output_token_ids=pa.array([r.output_token_ids for r in results], pa.list_(pa.int32())),
            output_text=pa.array([r.output_text for r in results], pa.string()),
            finish_reason=[r.finish_reason for r in results],
            output_logprobs=(
                None if all(x is None for x in lps) else pa.array(lps, pa.list_(pa.float32()))
            ),
            top_logprobs=None if all(x is None for x in tops) else tops,
        )

    def results(self) -> list[GenerationResult]:
        """One GenerationResult per request (Python lists: for callers outside the shard path)."""
        outputs = self.output_token_ids.to_pylist()
        texts = self.output_text.to_pylist()
        lps = self.output_logprobs.to_pylist() if self.output_logprobs is not None else None
        return [
            GenerationResult(
                request_id=rid,
                prompt_token_ids=self.prompt_token_ids[i],
                output_token_ids=outputs[i],
                output_text=texts[i],
                finish_reason=self.finish_reason[i],
                output_logprobs=None if lps is None else lps[i],
                top_logprobs=None if self.top_logprobs is None else self.top_logprobs[i],
            )
            for i, rid in enumerate(self.request_ids)
        ]


def prepare_prompt(request: GenerationRequest, max_model_len: int) -> list[int]:
    """The prompt tokens an engine feeds (after truncate_prompt_tokens), checked the same
    way by every engine: not empty, room left in the context, a uint64 seed."""
    prompt = list(map(int, request.prompt_token_ids))
    if request.params.truncate_prompt_tokens is not None:
        prompt = prompt[-request.params.truncate_prompt_tokens :]
    if not prompt:
        raise InputError(_where(request), "the prompt is empty (0 tokens)")
    if len(prompt) >= max_model_len:
        raise InputError(
            _where(request),
            f"the prompt has {len(prompt)} tokens, which leaves no room in the context of "
            f"{max_model_len} tokens (max_model_len); shorten it or set truncate_prompt_tokens",
        )
    if not 0 <= request.seq_seed < 2**64:
        raise ConfigError("seq_seed", request.seq_seed, f"must be a uint64, got {request.seq_seed}")
    return prompt


def check_forced(request: GenerationRequest, prompt: list[int], max_model_len: int, vocab: int) -> list[int]:  # fmt: skip
    """A teacher-forced request's completion, checked: not empty, inside the vocabulary and
    the context."""
    forced = list(map(int, request.forced_output or ()))
    where = f"request {request.request_id!r}: completion"
    if not forced:
        raise InputError(where, "the completion to score is empty (0 tokens)")
    bad = next((t for t in forced if not 0 <= t < vocab), None)
    if bad is not None:
        raise InputError(where, f"token id {bad} is outside the vocabulary [0, {vocab})")
    if len(prompt) + len(forced) > max_model_len:
        raise InputError(
            where,
            f"prompt ({len(prompt)}) and completion ({len(forced)}) tokens exceed the context of "
            f"{max_model_len} tokens (max_model_len)",
        )
    return forced


def with_forced(
    requests: Sequence[GenerationRequest],
    generate: Callable[[Sequence[GenerationRequest]], list[GenerationResult]],
    force: Callable[[Sequence[GenerationRequest]], list[GenerationResult]],
) -> list[GenerationResult]:
    """Results in request order: teacher-forced requests through `force`, the rest through
    `generate`."""
    results: list[GenerationResult | None] = [None] * len(requests)
    for forced in (False, True):
        picked = [i for i, r in enumerate(requests) if (r.forced_output is not None) == forced]
        if picked:
            done = (force if forced else generate)([requests[i] for i in picked])
            for i, result in zip(picked, done, strict=True):
                results[i] = result
    return [r for r in results if r is not None]


def _where(request: GenerationRequest) -> str:
    return f"request {request.request_id!r}: prompt_token_ids"


class Engine(ABC):
    """A generation backend. Construction is cheap; `start()` does the heavy work once.

    Engines are deterministic: a result depends only on the request (prompt tokens,
    sampling parameters, seq_seed) and the engine fingerprint, never on what else is in
    the batch, the batch size or the order of requests.
    """

    name: str = ""

    @abstractmethod
    def start(self) -> None:
        """Load weights and get ready to generate. Called once."""

    @abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Generate every request; results come back in request order."""

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> GenerationBatch:
        """`generate`, as columns. Engines that make token ids as arrays override this and
        build `generate` on it; the rest convert their results here."""
        return GenerationBatch.from_results(self.generate(requests))

    @abstractmethod
    def fingerprint(self) -> dict[str, Any]:
        """Everything about the engine that decides its output (DETERMINISM.md)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Tokenize a plain-text prompt as it is fed to the model."""

    def encode_continuation(self, text: str) -> list[int]:
        """Tokenize text that continues a prompt (a completion to teacher-force): no BOS or
        other special tokens added."""
        return self.encode(text)

    @abstractmethod
    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        """Render chat messages with the model's template, generation prompt added."""

    @abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str:
        """Detokenize, special tokens left out."""

    @property
    @abstractmethod
    def max_model_len(self) -> int:
        """The most tokens (prompt + output) one sequence may hold."""

    @classmethod
    def path_options(cls) -> tuple[str, ...]:
        """Names of the options that are paths: the service checks them against its data
        roots like a job's input and output."""
        return ()

    @classmethod
    def process_env(cls, options: dict[str, Any]) -> dict[str, str]:
        """Environment variables that a process running this engine must start with: the
        switches its numerics read at first use. Engine actors are started with them."""
        return {}

    @classmethod
    def token_decoder(cls, fingerprint: dict[str, Any]) -> Callable[[int], str] | None:
        """Token id -> its text (special tokens shown), for the engine that made a run with
        this fingerprint, without loading weights; None where no tokenizer is at hand."""
        return None

    def close(self) -> None:  # noqa: B027 - engines without resources need not override
        """Release the engine's resources."""

    def __enter__(self) -> Engine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HFTokenizerEngine(Engine):
    """An engine whose text side is a Hugging Face tokenizer (`self._tokenizer`, set by
    `start()`), and whose fingerprint and context limit come from its start and options."""

    _tokenizer: Any = None
    _fingerprint: dict[str, Any] | None = None
    options: Any

    @abstractmethod
    def _require_started(self) -> Any:
        """Raise EngineError unless start() has run."""

    def encode(self, text: str) -> list[int]:
        self._require_started()
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        self._require_started()
        return self._tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=True
        )

    def decode(self, token_ids: Sequence[int]) -> str:
        self._require_started()
        return self._tokenizer.decode(list(token_ids), skip_special_tokens=True)

    @property
    def max_model_len(self) -> int:
        return self.options.max_model_len

    def fingerprint(self) -> dict[str, Any]:
        self._require_started()
        assert self._fingerprint is not None
        return dict(self._fingerprint)
