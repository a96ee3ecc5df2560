"""Fake deepinfer.entrypoints.llm.LLM: deterministic tokens from (seq_seed, position, prompt)."""

import hashlib
import json
import os
from pathlib import Path

import deepinfer

ENGINE_ARGS = {"data_parallel_size", "context_parallel_size", "engine_rank", "engine_group_rank",
               "max_model_len", "max_num_seqs", "max_num_batched_tokens"}  # fmt: skip
MASK = 2**64 - 1


def _mix(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


class RequestOutput:
    """One generated token. Like the C++ object, its fields are methods."""

    def __init__(self, **fields):
        self._f = fields

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._f:
            raise AttributeError(name)
        return lambda: self._f[name]


class LLM:
    def __init__(self, model, tokenizer=None, trust_remote_code=False, expert_parallel_size=1,
                 revision=None, tokenizer_revision=None, seed=0, gpu_memory_utilization=0.9,
                 decode_sequence=True, **engine_args):  # fmt: skip
        unknown = set(engine_args) - ENGINE_ARGS
        if unknown:
            raise TypeError(f"unexpected engine args {sorted(unknown)}")
        dp = engine_args.get("data_parallel_size", 1)
        rank = engine_args.get("engine_rank", 0)
        if not 0 <= rank < dp:
            raise ValueError(f"engine_rank {rank} outside data_parallel_size {dp}")
        self.model = Path(model)
        config = json.loads((self.model / "config.json").read_text())
        self.vocab = int(config.get("vocab_size", 49152))
        self.eos = int(config.get("eos_token_id", 2))
        self.rank = rank
        self.decode_sequence = decode_sequence
        self.max_model_len = engine_args.get("max_model_len", 4096)
        self.invariant = deepinfer.IMPORT_ENV["DEEPINFER_BATCH_INVARIANT"] == "1"
        self._log({"event": "init", "model": str(model), "expert_parallel_size": expert_parallel_size,
                   "revision": revision, "seed": seed, "gpu_memory_utilization": gpu_memory_utilization,
                   "decode_sequence": decode_sequence, "engine_args": engine_args,
                   "import_env": deepinfer.IMPORT_ENV})  # fmt: skip

    def _log(self, record):
        record = {"pid": os.getpid(), "rank": self.rank, **record}
        with open(self.model / "calls.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def get_tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.model))

    def generate(self, prompts=None, sampling_params=None, prompt_token_ids=None, use_tqdm=True):
        die = self.model / f"die-rank-{self.rank}"
        if die.exists():
            die.unlink()
            os._exit(1)
        if (self.model / f"die-always-rank-{self.rank}").exists():
            os._exit(1)
        if prompt_token_ids is None:
            raise ValueError("this fake takes prompt_token_ids")
        if not isinstance(sampling_params, list):
            sampling_params = [sampling_params] * len(prompt_token_ids)
        if len(sampling_params) != len(prompt_token_ids):
            raise ValueError("one SamplingParams per prompt")
        self._log({"event": "generate", "use_tqdm": use_tqdm, "prompts": len(prompt_token_ids),
                   "requests": [{"prompt_len": len(ids), "seq_seed": p.seq_seed, "max_tokens": p.max_tokens,
                                 "temperature": p.temperature, "so_args": p.so_args}
                                for ids, p in zip(prompt_token_ids, sampling_params, strict=True)]})  # fmt: skip
        batch = 0 if self.invariant else len(prompt_token_ids)
        out = [
            self._one(ids, p, batch)
            for ids, p in zip(prompt_token_ids, sampling_params, strict=True)
        ]
        if self.decode_sequence:
            return ["".join(f"<{s.token_id()}>" for s in steps) for steps in out]
        return out

    def _one(self, ids, p, batch):
        if len(ids) >= self.max_model_len:
            raise ValueError("prompt too long")
        key = int.from_bytes(hashlib.sha256(bytes(str(list(ids)), "ascii")).digest()[:8], "little")
        seed = 0 if p.temperature == 0 else p.seq_seed
        steps = []
        for t in range(p.max_tokens):
            h = _mix(seed ^ key ^ _mix(t) ^ batch)
            token = h % self.vocab
            stop = not p.ignore_eos and h % 23 == 0
            if stop:
                token = self.eos
            last = stop or t == p.max_tokens - 1
            top = [(h >> (8 * k)) % self.vocab for k in range(p.top_logprobs)]
            steps.append(RequestOutput(
                token_id=token, token_logprobs=-((h >> 20) % 1000) / 100.0,
                top_token_ids=top, top_logprobs=[-(k + 1) / 10.0 for k in range(len(top))],
                finished=last, finish_reason=("stop" if stop else "length") if last else "",
                num_output_tokens=t + 1, prompt_len=len(ids), request_id=str(seed),
            ))  # fmt: skip
            if stop:
                break
        return steps

    def close(self):
        self._log({"event": "close"})
