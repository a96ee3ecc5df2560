"""Stand-in for deepinfer.entrypoints.llm.LLM, modelling what the real engine does that an
adapter can get wrong:

- the real signatures (`__init__`, `generate`, `get_tokenizer`, `close`);
- every rank steps together: the real engine all-reduces "unfinished?" across the
  data-parallel group at every step, so each rank must call `generate` in every round.
  Here the ranks of one replica meet at a file barrier per round; a rank whose partners do
  not arrive within FAKE_DEEPINFER_STEP_TIMEOUT seconds (default 10) raises at once
  instead of hanging until DEEPINFER_GLOO_TIMEOUT;
- outputs: per prompt, a list of per-token RequestOutputs (read-only attributes); EOS is
  the model's eos_token_id (1 for DeepSeek's tokenizer) and is the last output; logprobs
  floored at -9999.0; top_logprobs up to 1000;
- every finish reason: `prompt_length_exceeded` for a prompt longer than max_model_len
  (one output whose token_id is the last prompt token); the others for prompts whose first
  token is FINISH_TRIGGER + k (k indexes FINISH_REASONS), after two tokens;
- prompt_logprobs (one per prompt token but the first, on the first output) and
  golden_token_ids (the outputs are those tokens, with their logprobs);
- the tokenizer's BOS policy: encode() of text inserts BOS (id 0).
Tokens are a pure function of (seq_seed, position, prompt tokens); with
DEEPINFER_BATCH_INVARIANT not 1 at import they also depend on the batch size. Every LLM
appends what it was built and called with to <model dir>/calls.jsonl; a file
<model dir>/die-rank-<r> makes rank r exit in its next generate (die-always-rank-<r>: every
time).
"""

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import deepinfer
from deepinfer._C.engine import RequestOutput
from deepinfer.sampling_params import SamplingParams

ENGINE_ARGS = {"data_parallel_size", "context_parallel_size", "engine_rank", "engine_group_rank",
               "max_model_len", "max_num_seqs", "max_num_batched_tokens", "chunked_prefill"}  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "prompt_length_exceeded",
                  "insufficient_system_resource", "xgrammar runtime errors or timeout", "ve_error")  # fmt: skip
FINISH_TRIGGER = 99_000
LOGPROB_FLOOR = -9999.0
MASK = 2**64 - 1


def _mix(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def release_tokenizer(path, bos, eos):
    """The folder's tokenizer with DeepInfer's release policy (hugging_face/tokenizer.py): a
    plain transformers tokenizer whose encode() inserts BOS; EOS at the model's id."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    bos_token = tok.convert_ids_to_tokens(bos)
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos_token} $A", pair=f"{bos_token} $A $B", special_tokens=[(bos_token, bos)]
    )
    tok.bos_token, tok.eos_token = bos_token, tok.convert_ids_to_tokens(eos)
    return tok


class LLM:
    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        trust_remote_code: bool = False,
        expert_parallel_size: int = 1,
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.9,
        decode_sequence: bool = True,
        **kwargs: Any,
    ) -> None:
        unknown = set(kwargs) - ENGINE_ARGS
        if unknown:
            raise TypeError(f"unexpected engine args {sorted(unknown)}")
        envs = deepinfer.envs
        interval, window = (
            envs.DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL,
            envs.DEEPINFER_EXPERT_COUNT_WINDOW_SIZE,
        )
        if interval != 0 and not 0 < window <= interval:  # as eplb/__init__.py
            raise ValueError(f"DEEPINFER_EXPERT_COUNT_WINDOW_SIZE={window} must be between 1 and "
                             f"DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL={interval} when rearrangement is enabled")  # fmt: skip
        dp = kwargs.get("data_parallel_size", 1)
        rank = kwargs.get("engine_rank", 0)
        if not 0 <= rank < dp:
            raise ValueError(f"engine_rank {rank} outside data_parallel_size {dp}")
        max_seqs = kwargs.get("max_num_seqs", 256)
        batched = kwargs.get("max_num_batched_tokens")
        if batched is not None:  # config.py: _get_max_num_batched_tokens
            assert batched >= max_seqs * (1 + envs.DEEPINFER_USE_NEXTN_DECODE)
        self.model = Path(model)
        config = json.loads((self.model / "config.json").read_text())
        self.vocab = int(config.get("vocab_size", 129280))
        self.eos = int(config.get("eos_token_id", 1))
        self.rank, self.dp = rank, dp
        self.decode_sequence = decode_sequence
        self.max_model_len = kwargs.get("max_model_len", 4096)
        self.invariant = envs.DEEPINFER_BATCH_INVARIANT
        self.round = 0
        self.barrier = self.model / f"rendezvous-{os.environ.get('MASTER_PORT', '23333')}"
        self._tokenizer = None
        self._log({"event": "init", "model": str(model), "expert_parallel_size": expert_parallel_size,
                   "revision": revision, "seed": seed, "gpu_memory_utilization": gpu_memory_utilization,
                   "decode_sequence": decode_sequence, "engine_args": kwargs,
                   "import_env": deepinfer.IMPORT_ENV})  # fmt: skip

    def _log(self, record):
        record = {"pid": os.getpid(), "rank": self.rank, **record}
        with open(self.model / "calls.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def get_tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = release_tokenizer(str(self.model), 0, self.eos)
        return self._tokenizer

    def _step_together(self):
        """The all-reduce at every step: every rank of the replica must be in this round."""
        here = self.barrier / f"round-{self.round}"
        here.mkdir(parents=True, exist_ok=True)
        (here / f"rank-{self.rank}").touch()
        deadline = time.monotonic() + float(os.environ.get("FAKE_DEEPINFER_STEP_TIMEOUT", "10"))
        while True:
            missing = [r for r in range(self.dp) if not (here / f"rank-{r}").exists()]
            if not missing:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"rank {self.rank}: ranks {missing} did not call generate in round {self.round}; "
                    "DeepInfer all-reduces across the data-parallel group at every step, so every rank "
                    "must call generate in every round (the real engine hangs until DEEPINFER_GLOO_TIMEOUT)"
                )
            time.sleep(0.005)
        self.round += 1

    def generate(
        self,
        prompts: str | list[str] | None = None,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        prompt_token_ids: list[list[int]] | None = None,
        use_tqdm: bool = True,
        multi_modal_data: dict | list[dict] | None = None,
    ) -> list:
        die = self.model / f"die-rank-{self.rank}"
        if die.exists():
            die.unlink()
            os._exit(1)
        if (self.model / f"die-always-rank-{self.rank}").exists():
            os._exit(1)
        if prompts is None and prompt_token_ids is None:
            raise ValueError("Either prompts or prompt_token_ids must be provided.")
        if isinstance(prompts, str):
            prompts = [prompts]
        if prompt_token_ids is None:
            prompt_token_ids = [self.get_tokenizer().encode(p) for p in prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompt_token_ids)
        if len(sampling_params) != len(prompt_token_ids):
            raise IndexError("one SamplingParams per prompt")
        self._step_together()
        self._log({"event": "generate", "use_tqdm": use_tqdm, "prompts": len(prompt_token_ids),
                   "requests": [{"prompt_len": len(ids), "seq_seed": p.seq_seed, "max_tokens": p.max_tokens,
                                 "temperature": p.temperature, "top_logprobs": p.top_logprobs,
                                 "prompt_logprobs": p.prompt_logprobs, "so_args": p.so_args,
                                 "golden_token_ids": p.golden_token_ids}
                                for ids, p in zip(prompt_token_ids, sampling_params, strict=True)]})  # fmt: skip
        batch = 0 if self.invariant else len(prompt_token_ids)
        out = [self._one(list(map(int, ids)), p, batch)
               for ids, p in zip(prompt_token_ids, sampling_params, strict=True)]  # fmt: skip
        if self.decode_sequence:
            return [self.get_tokenizer().decode([x.token_id for x in steps]) for steps in out]
        return out

    def _one(self, ids, p, batch):
        if len(ids) >= self.max_model_len:  # rejected: one output, the last prompt token
            return [RequestOutput(token_id=ids[-1], token_logprobs=0.0, top_token_ids=[], top_logprobs=[],
                                  finished=True, finish_reason="prompt_length_exceeded",
                                  num_output_tokens=1, prompt_len=len(ids), request_id="0")]  # fmt: skip
        forced = None
        if ids and FINISH_TRIGGER <= ids[0] < FINISH_TRIGGER + len(FINISH_REASONS):
            forced = FINISH_REASONS[ids[0] - FINISH_TRIGGER]
        key = int.from_bytes(hashlib.sha256(bytes(str(ids), "ascii")).digest()[:8], "little")
        golden = p.golden_token_ids
        steps = []
        limit = len(golden) if golden is not None else p.max_tokens
        for t in range(limit):
            h = _mix(p.seq_seed ^ key ^ _mix(t) ^ batch)
            token = golden[t] if golden is not None else h % self.vocab
            stop = golden is None and not p.ignore_eos and h % 23 == 0
            if stop:
                token = self.eos
            last = stop or t == limit - 1 or (forced is not None and t == 1)
            reason = ""
            if last:
                reason = forced if forced is not None and t == 1 else ("stop" if stop else "length")
            top = [(h >> (8 * k)) % self.vocab for k in range(p.top_logprobs)]
            logprob = max(LOGPROB_FLOOR, -((h >> 20) % 100_000) / 10.0)
            prompt_lps = None
            if t == 0 and p.prompt_logprobs:
                prompt_lps = [max(LOGPROB_FLOOR, -((key >> (i % 40)) % 1000) / 100.0) for i in range(len(ids) - 1)]  # fmt: skip
            steps.append(RequestOutput(
                token_id=token, token_logprobs=logprob, top_token_ids=top,
                top_logprobs=[-(k + 1) / 10.0 for k in range(len(top))], prompt_logprobs=prompt_lps,
                finished=last, finish_reason=reason, num_output_tokens=t + 1, prompt_len=len(ids),
                request_id=str(key),
            ))  # fmt: skip
            if last:
                break
        return steps

    def close(self) -> None:
        self._log({"event": "close"})
