"""`rollout generate PROMPT`: one generation from the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import ValidationError

from rollout import determinism
from rollout.data.sink import top_positions_hash
from rollout.engines import ENGINES, GenerationRequest, check_top_logprobs, create_engine
from rollout.errors import ConfigError, config_error_from_validation
from rollout.sampling_params import SamplingParams


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "generate",
        help="generate a completion for one prompt",
        description="Generate one completion with the embedded engine (or another by --engine). "
        "The sample's seed is derived from --seed as for example id '0', sample 0 of a job.",
    )
    p.add_argument("prompt", help="the prompt text (with --chat: the user message)")
    p.add_argument(
        "--chat",
        action="store_true",
        help="render the prompt as a user message with the chat template",
    )
    p.add_argument("--system", default=None, help="with --chat: a system message")
    p.add_argument(
        "--engine",
        default="smollm2",
        choices=sorted(ENGINES),
        help="engine name (default: smollm2)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default: 1.0)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="job seed, a uint64 (default: 0)")
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--logprobs", action="store_true", help="with --json: per-token logprobs")
    p.add_argument(
        "--top-logprobs", type=int, default=0, help="with --json: top-N logprobs per token"
    )
    p.add_argument("--json", action="store_true", help="print JSON: token ids, seq_seed, hashes")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        params = SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_tokens=args.max_tokens,
            stop=args.stop,
            ignore_eos=args.ignore_eos,
            logprobs=args.logprobs,
            top_logprobs=args.top_logprobs,
        )
    except ValidationError as exc:
        raise config_error_from_validation(exc) from None
    example_id, sample_index = "0", 0
    if not 0 <= args.seed <= determinism.UINT64_MAX:
        raise ConfigError(
            "--seed", args.seed, f"must be an unsigned 64-bit integer, got {args.seed}"
        )
    seed = determinism.seq_seed(args.seed, example_id, sample_index)
    try:
        check_top_logprobs(args.engine, args.top_logprobs)
    except ValueError as exc:
        raise ConfigError("--top-logprobs", args.top_logprobs, str(exc)) from None
    with create_engine(args.engine) as engine:
        if args.chat:
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": args.prompt}
            ]
            prompt = engine.apply_chat_template(messages)
        else:
            prompt = args.prompt
        ids = engine.encode(prompt)
        (result,) = engine.generate([GenerationRequest(example_id, ids, params, seed)])
        fingerprint = engine.fingerprint()
    if not args.json:
        print(result.output_text)
        return 0
    prompt_hash = determinism.token_hash(result.prompt_token_ids)
    output_hash = determinism.token_hash(result.output_token_ids)
    lp_hash = determinism.logprobs_hash(result.output_logprobs)
    top_hash = top_positions_hash(result.top_logprobs)
    record = {
        "example_id": example_id,
        "sample_index": sample_index,
        "seq_seed": seed,
        "prompt": prompt,
        "prompt_token_ids": result.prompt_token_ids,
        "output_text": result.output_text,
        "output_token_ids": result.output_token_ids,
        "finish_reason": result.finish_reason,
        "prompt_hash": prompt_hash,
        "output_hash": output_hash,
        "logprobs_hash": lp_hash,
        "top_logprobs_hash": top_hash,
        "row_hash": determinism.versioned_row_hash(
            determinism.CURRENT_VERSION,
            (example_id, sample_index, seed, prompt_hash, output_hash, result.finish_reason),
            lp_hash,
            top_hash,
        ),
        "determinism": determinism.CURRENT_VERSION,
        "engine": fingerprint,
    }
    if result.output_logprobs is not None:
        record["output_logprobs"] = result.output_logprobs
    if result.top_logprobs is not None:
        record["top_logprobs"] = [[list(t) for t in pos] for pos in result.top_logprobs]
    print(json.dumps(record, ensure_ascii=False))
    return 0
