"""Fake deepinfer.sampling_params: the constructor and checks of DEEPINFER.md."""

import random

SCHEMA_TYPES = ("regex", "json", "ebnf")


class SamplingParams:
    def __init__(
        self,
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        ignore_eos=False,
        max_tokens=16,
        top_logprobs=0,
        prompt_logprobs=False,
        so_args=None,
        seq_seed=None,
    ):
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k != -1 and top_k < 1:
            raise ValueError(f"top_k must be -1 or >= 1, got {top_k}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {top_logprobs}")
        if so_args is not None and (
            set(so_args) != {"schema_type", "schema"} or so_args["schema_type"] not in SCHEMA_TYPES
        ):
            raise ValueError(f"so_args must be {{schema_type, schema}}, got {so_args}")
        if seq_seed is None:  # as the real one: drawn from Python's random
            seq_seed = random.getrandbits(64)
        if not isinstance(seq_seed, int) or not 0 <= seq_seed < 2**64:
            raise ValueError(f"seq_seed must be a uint64, got {seq_seed!r}")
        self.temperature = 0.0 if temperature == 0 else float(temperature)
        self.top_p, self.top_k = float(top_p), int(top_k)
        self.ignore_eos, self.max_tokens = bool(ignore_eos), int(max_tokens)
        self.top_logprobs, self.prompt_logprobs = int(top_logprobs), bool(prompt_logprobs)
        self.so_args, self.seq_seed = so_args, seq_seed
