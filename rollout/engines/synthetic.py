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
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollout.determinism import int32_le_bytes
from rollout.engines.base import Engine, GenerationRequest, GenerationResult, prepare_prompt
from rollout.engines.stopping import StopState
from rollout.errors import EngineError, config_error_from_validation

VERSION = "1"
BOS, EOS, FIRST_BYTE = 1, 2, 3
FIRST_WORD = FIRST_BYTE + 256  # generated tokens are words, never bytes
_M = np.uint64(0xFFFFFFFFFFFFFFFF)


class SyntheticOptions(BaseModel):
    """`engine.options` for `engine.name: synthetic`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(
        32000, ge=300, le=1 << 24, description="Token ids are in [0, vocab_size)."
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

    def __init__(self, **options: Any) -> None:
        try:
            self.options = SyntheticOptions(**options)
        except ValidationError as exc:
            raise config_error_from_validation(exc, prefix="engine.options") from None
        self._started = False
        # id -> text for generated ids (all >= FIRST_WORD): decoding is a table lookup
        self._words = [""] * FIRST_WORD + [
            f" w{t}" for t in range(FIRST_WORD, self.options.vocab_size)
        ]
        self._words[EOS] = ""

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
    def _natural_lens(self, keys: np.ndarray) -> list[int]:
        """Where each sequence would emit EOS, drawn from the output length distribution."""
        o = self.options
        h = _splitmix(keys ^ np.uint64(0xA5A5A5A5))
        if o.output_len == "fixed":
            return [o.mean_output_len] * len(keys)
        if o.output_len == "uniform":
            return (1 + h % np.uint64(2 * o.mean_output_len - 1)).astype(np.int64).tolist()
        if o.mean_output_len == 1:
            return [1] * len(keys)
        u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        return (
            (1 + np.floor(np.log(u) / np.log1p(-1.0 / o.mean_output_len))).astype(np.int64).tolist()
        )

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        if not self._started:
            raise EngineError("the synthetic engine is not started: call start() first")
        o = self.options
        prompts, keys, room = [], [], []
        for r in requests:
            params = r.params
            prompt = prepare_prompt(r, o.max_model_len)
            prompts.append(prompt)
            keys.append((0 if params.greedy else r.seq_seed) ^ _prompt_key(prompt))
            room.append(min(params.max_tokens, o.max_model_len - len(prompt)))
        if not requests:
            return []
        # Every sequence's hashes at once: row i, position t -> splitmix(key_i ^ splitmix(t)).
        key = np.array(keys, dtype=np.uint64)
        natural = self._natural_lens(key)
        width = max(room)
        h = _splitmix(key[:, None] ^ _splitmix(np.arange(width, dtype=np.uint64))[None, :])
        ids = (FIRST_WORD + h % np.uint64(o.vocab_size - FIRST_WORD)).astype(np.int32)
        results, tokens_out = [], 0
        all_ids = ids.tolist()  # one conversion for the batch: cheaper than one per row
        all_lps = None
        if any(r.params.logprobs for r in requests):
            lps = -((h >> np.uint64(20)) % np.uint64(1000)).astype(np.float32) / np.float32(100)
            all_lps = lps.tolist()
        for i, r in enumerate(requests):
            params = r.params
            eos_at = natural[i] if not params.ignore_eos and natural[i] <= room[i] else 0
            n = eos_at or room[i]
            row = all_ids[i][:n]
            if eos_at:
                row[-1] = EOS
            if params.stop or params.stop_token_ids:  # the shared rules, token by token
                stop = StopState(params, frozenset([EOS]), room[i], self.decode)
                for t in row:
                    if stop.append(t):
                        break
                out, finish, text = (
                    stop.token_ids,
                    stop.finish_reason or "length",
                    stop.output_text(),
                )
            else:
                out, finish = row, "stop" if eos_at else "length"
                text = "".join(map(self._words.__getitem__, out))
            k = len(out)
            top = None
            if params.top_logprobs:
                span = np.uint64(o.vocab_size - FIRST_WORD)
                top = [[(FIRST_WORD + int((x >> np.uint64(8 * j)) % span), -(j + 1) / 10.0)
                        for j in range(params.top_logprobs)] for x in h[i, :k]]  # fmt: skip
            results.append(GenerationResult(
                request_id=r.request_id, prompt_token_ids=prompts[i], output_token_ids=out,
                output_text=text, finish_reason=finish,
                output_logprobs=all_lps[i][:k] if params.logprobs else None, top_logprobs=top,
            ))  # fmt: skip
            tokens_out += k
        from rollout.runtime import faults

        faults.point("mid_generation")
        if o.tokens_per_s:
            time.sleep(tokens_out / o.tokens_per_s * self._slow)
        return results
