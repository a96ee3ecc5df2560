"""Engines by name, imported lazily so that a heavy backend loads only when chosen."""

from __future__ import annotations

import importlib
from typing import Any

from rollout.engines.base import Engine, GenerationRequest, GenerationResult
from rollout.errors import ConfigError

# name -> "module:Class". Importing this package imports none of them.
ENGINES: dict[str, str] = {
    "smollm2": "rollout.engines.smollm2:SmolLM2Engine",
    "deepinfer": "rollout.engines.deepinfer_replica:DeepInferReplica",
    "synthetic": "rollout.engines.synthetic:SyntheticEngine",
}

# Engines that honour SamplingParams.so_args (structured output); the others refuse a job
# that asks for it when the spec is validated.
STRUCTURED_OUTPUT: frozenset[str] = frozenset({"deepinfer"})

# The most top logprobs per position each engine returns (DeepInfer: 1,000; the CPU engines
# rank candidates in Python per sampled token, so they stop at 20).
MAX_TOP_LOGPROBS: dict[str, int] = {"deepinfer": 1000, "smollm2": 20, "synthetic": 20}


def check_top_logprobs(engine: str, top_logprobs: int) -> None:
    """Refuse more top logprobs than the engine returns, naming both numbers."""
    limit = MAX_TOP_LOGPROBS.get(engine, 20)
    if top_logprobs > limit:
        raise ValueError(
            f"sampling.top_logprobs is {top_logprobs}; engine {engine!r} returns at most {limit}"
        )


def engine_class(name: str) -> type[Engine]:
    """The engine class registered under `name`; an unknown name lists the valid ones."""
    target = ENGINES.get(name)
    if target is None:
        valid = ", ".join(sorted(ENGINES))
        raise ConfigError("engine.name", name, f"unknown engine {name!r}; valid engines: {valid}")
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def create_engine(name: str, **options: Any) -> Engine:
    """Build the named engine with its options (not started)."""
    return engine_class(name)(**options)


__all__ = [
    "ENGINES",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "create_engine",
    "engine_class",
]
