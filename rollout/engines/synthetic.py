"""The synthetic engine: deterministic tokens without a model, at a simulated speed.

For exercising every orchestration path at any scale (`engine.name: synthetic`): token t
of a sequence is splitmix64(seq_seed, t, prompt) mod the vocabulary, so output depends
only on the request, never on the batch. Output lengths follow a configurable
distribution, drawn per sequence from the same hash; EOS ends a sequence there (unless
ignore_eos), stop token ids and stop strings end it as in every engine (StopState).
Logprobs are a deterministic function of the token. `tokens_per_s` simulates a
replica's throughput (the batch sleeps for its output tokens / tokens_per_s) and
`startup_s` its start-up, and `slow_claim_file` makes one replica a straggler; none of
these is part of the fingerprint, since none changes the output. The tokenizer is byte-level: ids 3..258 are UTF-8 bytes, 0-2 are specials, and
ids from 259 on (all generated tokens) decode to short words.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout.data.columns import list_array
from rollout.determinism import int32_le_bytes
from rollout.engines.base import (
    Engine,
    GenerationBatch,
    GenerationRequest,
    GenerationResult,
    check_forced,
    prepare_prompt,
    with_forced,
)
from rollout.engines.stopping import StopState
from rollout.errors import EngineError, RowError, config_error_from_validation

VERSION = "1"
BOS, EOS, FIRST_BYTE = 1, 2, 3
FIRST_WORD = FIRST_BYTE + 256  # generated tokens are words, never bytes
_MAX_DIGITS = 7  # vocab_size <= 2**20: ids have at most 7 decimal digits
_TEXT_ROWS = 4096


class SyntheticOptions(BaseModel):
    """`engine.options` for `engine.name: synthetic`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(
        32000, ge=300, le=1 << 20, description="Token ids are in [0, vocab_size)."
    )
    output_len: Literal["fixed", "uniform", "geometric"] = Field(
        "uniform", description="How a sequence's natural length (where it emits EOS) is drawn."
    )
    mean_output_len: int = Field(
        64, ge=1, description="fixed: the length; uniform: 1..2*mean-1; geometric: its mean."
    )
    max_model_len: int = Field(1 << 20, ge=2, description="Prompt + output tokens per sequence.")
    tokens_per_s: float | None = Field(
        None, gt=0, description="Simulated output tokens per second of this engine; none: no delay."
    )
    startup_s: float = Field(0.0, ge=0, description="Simulated start-up delay.")
    max_num_seqs: int = Field(
        256, ge=1, description="Accepted for layout experiments; no effect on output."
    )
    slow_claim_file: str | None = Field(
        None,
        description="Straggler experiments: the first replica to create this file (O_EXCL) runs "
        "slow_factor times slower than tokens_per_s.",
    )
    slow_factor: float = Field(10.0, ge=1, description="How much slower the claiming replica is.")
    reject_text: str | None = Field(
        None,
        max_length=256,
        description="Rejects (as DeepInfer does with finish reason 'abort') every request whose "
        "prompt holds this text: a row error, for exercising on_error.",
    )


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _prompt_key(ids: Sequence[int]) -> int:
    data = int32_le_bytes(ids)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class SyntheticEngine(Engine):
    name = "synthetic"

    @classmethod
    def path_options(cls) -> tuple[str, ...]:
        return ("slow_claim_file",)

    def __init__(self, **options: Any) -> None:
        try:
            self.options = SyntheticOptions(**options)
        except ValidationError as exc:
            raise config_error_from_validation(exc, prefix="engine.options") from None
        self._started = False
        self._words: pa.StringArray | None = None  # id -> text, made on first use

    def start(self) -> None:
        if not self._started:
            if self.options.startup_s:
                time.sleep(self.options.startup_s)
            self._slow = 1.0
            if self.options.slow_claim_file:
                try:
                    os.close(
                        os.open(self.options.slow_claim_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                    )
                    self._slow = self.options.slow_factor
                except FileExistsError:
                    pass
            self._started = True

    def fingerprint(self) -> dict[str, Any]:
        o = self.options
        return {"engine": self.name, "engine_version": VERSION, "vocab_size": o.vocab_size,
                "output_len": o.output_len, "mean_output_len": o.mean_output_len,
                "max_model_len": o.max_model_len}  # fmt: skip

    # -- tokenizer -------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(map(FIRST_BYTE.__add__, text.encode("utf-8")))

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> str:
        parts = [f"<|{m['role']}|>{m['content']}\n" for m in messages]
        return "".join(parts) + "<|assistant|>"

    def decode(self, token_ids: Sequence[int]) -> str:
        out, pending = [], bytearray()
        for t in token_ids:
            if FIRST_BYTE <= t < FIRST_BYTE + 256:
                pending.append(t - FIRST_BYTE)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if t >= FIRST_WORD:
                out.append(f" w{t}")
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    @property
    def max_model_len(self) -> int:
        return self.options.max_model_len

    # -- generation ------------------------------------------------------------------------------
    def _natural_lens(self, keys: np.ndarray) -> np.ndarray:
        """Where each sequence would emit EOS, drawn from the output length distribution."""
        o = self.options
        h = _splitmix(keys ^ np.uint64(0xA5A5A5A5))
        if o.output_len == "fixed" or o.mean_output_len == 1:
            return np.full(len(keys), o.mean_output_len, dtype=np.int64)
        if o.output_len == "uniform":
            return (1 + h % np.uint64(2 * o.mean_output_len - 1)).astype(np.int64)
        u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        return (1 + np.floor(np.log(u) / np.log1p(-1.0 / o.mean_output_len))).astype(np.int64)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return with_forced(
            requests, lambda rs: self._generate_batch(rs).results(), self._teacher_force
        )

    def generate_batch(self, requests: Sequence[GenerationRequest]) -> GenerationBatch:
        if any(r.forced_output is not None for r in requests):
            return GenerationBatch.from_results(self.generate(requests))
        return self._generate_batch(requests)

    def _teacher_force(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """The given completion; the logprob of token t is a function of the prompt, t and the token."""
        out = []
        for r in requests:
            prompt = prepare_prompt(r, self.options.max_model_len)
            forced = check_forced(r, prompt, self.options.max_model_len, self.options.vocab_size)
            key = np.uint64(_prompt_key(prompt))
            h = _splitmix(key ^ _splitmix(np.arange(len(forced), dtype=np.uint64))
                          ^ np.array(forced, dtype=np.uint64))  # fmt: skip
            lps = (-((h >> np.uint64(20)) % np.uint64(1000)).astype(np.float32) / np.float32(100)).tolist()  # fmt: skip
            out.append(GenerationResult(r.request_id, prompt, forced, self.decode(forced), "length",
                                        lps if r.params.logprobs else None))  # fmt: skip
        return out

    def _generate_batch(self, requests: Sequence[GenerationRequest]) -> GenerationBatch:
        """Every sequence at once, as arrays: token t of row i is splitmix(key_i ^ splitmix(t)),
        cut where the row ends; only rows with stop strings or stop token ids go token by token."""
        if not self._started:
            raise EngineError("the synthetic engine is not started: call start() first")
        o = self.options
        if o.reject_text is not None:
            marker = self.encode(o.reject_text)
            for r in requests:
                ids = list(r.prompt_token_ids)
                if any(
                    ids[i : i + len(marker)] == marker for i in range(len(ids) - len(marker) + 1)
                ):
                    raise RowError(r.request_id, "abort", "the engine rejected the request (synthetic: its prompt holds reject_text)")  # fmt: skip
        prompts, keys, room = [], [], []
        source: object = None
        last_params = None
        for r in requests:
            params = r.params
            if r.prompt_token_ids is not source or params is not last_params:
                # the n samples of a row share one prompt: check and key it once
                source, last_params = r.prompt_token_ids, params
                prompt = prepare_prompt(r, o.max_model_len)
                prompt_key, left = _prompt_key(prompt), o.max_model_len - len(prompt)
            elif not 0 <= r.seq_seed < 2**64:
                prepare_prompt(r, o.max_model_len)  # raises the seed's error
            prompts.append(prompt)
            keys.append((0 if params.greedy else r.seq_seed) ^ prompt_key)
            room.append(min(params.max_tokens, left))
        if not requests:
            return GenerationBatch.from_results([])
        key = np.array(keys, dtype=np.uint64)
        natural = self._natural_lens(key)
        rooms = np.array(room, dtype=np.int64)
        ignore = np.array([r.params.ignore_eos for r in requests], dtype=bool)
        eos = ~ignore & (natural <= rooms)
        lens = np.where(eos, natural, rooms)
        width = int(lens.max())
        h = _splitmix(key[:, None] ^ _splitmix(np.arange(width, dtype=np.uint64))[None, :])
        ids = (FIRST_WORD + h % np.uint64(o.vocab_size - FIRST_WORD)).astype(np.int32)
        rows = np.flatnonzero(eos)
        ids[rows, lens[rows] - 1] = EOS
        finish = np.where(eos, "stop", "length").tolist()
        texts: dict[int, str] = {}  # rows whose text a stop string decided
        for i, r in enumerate(requests):
            params = r.params
            if params.stop or params.stop_token_ids:  # the shared rules, token by token
                stop = StopState(params, frozenset([EOS]), room[i], self.decode)
                for t in ids[i, : lens[i]].tolist():
                    if stop.append(t):
                        break
                lens[i], finish[i] = len(stop.token_ids), stop.finish_reason or "length"
                texts[i] = stop.output_text()
        kept = np.arange(width)[None, :] < lens[:, None]
        offsets = np.zeros(len(requests) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        values = ids[kept]
        logprobs = None
        wants = np.array([r.params.logprobs for r in requests], dtype=bool)
        if wants.any():
            lps = -((h >> np.uint64(20)) % np.uint64(1000)).astype(np.float32) / np.float32(100)
            logprobs = list_array(offsets, lps[kept], pa.float32(), null=~wants)
        top = None
        if any(r.params.top_logprobs for r in requests):
            span = np.uint64(o.vocab_size - FIRST_WORD)
            top = [[[(FIRST_WORD + int((x >> np.uint64(8 * j)) % span), -(j + 1) / 10.0)
                     for j in range(r.params.top_logprobs)] for x in h[i, : lens[i]]]
                   if r.params.top_logprobs else None for i, r in enumerate(requests)]  # fmt: skip
        batch = GenerationBatch(
            request_ids=[r.request_id for r in requests],
            prompt_token_ids=prompts,
            output_token_ids=list_array(offsets, values, pa.int32()),
            output_text=self._texts(values, offsets, texts),
            finish_reason=finish,
            output_logprobs=logprobs,
            top_logprobs=top,
        )
        from rollout.runtime import faults

        faults.point("mid_generation")
        if o.tokens_per_s:
            time.sleep(int(offsets[-1]) / o.tokens_per_s * self._slow)
        return batch

    def _texts(
        self, values: np.ndarray, offsets: np.ndarray, given: dict[int, str]
    ) -> pa.ChunkedArray:
        """Each row's decoded text, joined from the vocabulary's words in Arrow; rows in
        `given` (ended by a stop string) take that text instead."""
        if self._words is None:  # every id's text, built once: " w<id>" from FIRST_WORD on
            data, sizes = _word_bytes(np.arange(self.options.vocab_size, dtype=np.int64))
            ends = np.zeros(len(sizes) + 1, dtype=np.int32)
            np.cumsum(sizes, out=ends[1:])
            self._words = pa.StringArray.from_buffers(
                len(sizes), pa.py_buffer(ends), pa.py_buffer(data)
            )
        words = pa.ListArray.from_arrays(
            pa.array(offsets.astype(np.int32)), self._words.take(pa.array(values))
        )
        # joined a slice of rows at a time, so no one string column outgrows its 2 GiB offsets
        texts = pa.chunked_array(
            [
                pc.binary_join(words.slice(i, _TEXT_ROWS), "")
                for i in range(0, len(words), _TEXT_ROWS)
            ],
            pa.string(),
        )
        if given:
            rows = texts.to_pylist()
            for i, text in given.items():
                rows[i] = text
            texts = pa.chunked_array([pa.array(rows, pa.string())])
        return texts


def _word_bytes(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The text of each token id (" w<id>" for generated ids, nothing below FIRST_WORD) as
    ASCII bytes, all concatenated, and each id's byte count."""
    digits = np.ones(len(ids), dtype=np.int64)
    for power in range(1, _MAX_DIGITS):
        digits += ids >= 10**power
    sizes = np.where(ids < FIRST_WORD, 0, 2 + digits)
    chars = np.zeros((len(ids), 2 + _MAX_DIGITS), dtype=np.uint8)
    chars[:, 0], chars[:, 1] = ord(" "), ord("w")
    for j in range(_MAX_DIGITS):  # digit j from the left, where the number has one
        power = np.maximum(digits - 1 - j, 0)
        chars[:, 2 + j] = ord("0") + (ids // 10**power) % 10
    return chars[np.arange(chars.shape[1])[None, :] < sizes[:, None]], sizes
