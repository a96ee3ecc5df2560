"""DeepInfer 0.1.0: one engine rank, the `LLM` of one GPU.

The reference is the package's own source (sdist 0.1.0, sha256 959b9bd0...); the stand-in
under tests/fakes/ is checked against it by tests/engines/test_deepinfer_contract.py.
What this module owns, and where each fact lives:
- the environment of a rank process, set before `deepinfer` is imported
  (`deepinfer_env`): the determinism switches and every variable of DeepInfer's
  `environ.py` that changes outputs, pinned (Ray workers inherit the raylet's
  environment, so an unpinned one could come from anywhere) and recorded in the
  fingerprint;
- the preflight: clear errors before any heavy work (`preflight`);
- the adapter (`DeepInferRank`): our requests in as `prompt_token_ids`, each with its
  own `SamplingParams(seq_seed=...)`, `decode_sequence=False`; the per-token
  `RequestOutput`s (read-only attributes of a C++ object) mapped back. Every rank calls
  `generate` in every round, with an empty list when it has nothing: the engine loop
  all-reduces "unfinished?" across the data-parallel group at every step. DeepInfer has
  no stop strings, stop token ids or `n`: the service expands `n` into requests and ends
  sequences with the shared StopState, exactly as for every engine.
A node's 8 ranks form one replica (`rollout.engines.deepinfer_replica`), which is the
engine a job names (`engine.name: deepinfer`). `deepinfer` is never imported at module
import: it is an optional extra that only GPU nodes have.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollout.engines.base import GenerationRequest, GenerationResult, check_forced, prepare_prompt
from rollout.engines.stopping import StopState
from rollout.errors import ConfigError, EngineError, RowError

ADAPTER_VERSION = "2"
# rollout's own variable (DeepInfer itself never reads it): the default model folder
MODEL_DIR_ENV = "DEEPINFER_HF_MODEL_DIR"
# What the model folder must hold for DeepInfer to load it
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json")  # fmt: skip
# Every rank process starts with these. Two are the determinism switches; the rest are
# DeepInfer's defaults (environ.py), pinned so that an inherited value cannot change outputs
# or claim host memory (the multimodal pool pins 8 GiB per rank). The contract test checks
# each name, and each default, against the real environ.py.
SWITCHES = {"DEEPINFER_BATCH_INVARIANT": "1", "DEEPINFER_ENABLE_MTP_VARLEN": "0"}
PINNED_DEFAULTS = {
    "DEEPINFER_SAMPLER_FORCE_TOPK": "0",
    "DEEPINFER_DECODE_TOKEN_BLACKLIST": "",
    "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE": "off",
    "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS": "0",
    "DEEPINFER_DFLASH_CONFIDENCE_HEAD_TEMPERATURE": "1.0",
    "DEEPINFER_EXPERT_COUNT_WINDOW_SIZE": "100",
    "DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS": "0",
    "DEEPINFER_USE_MULTIMODAL_POOL": "0",
}
NEXTN_ENV = "DEEPINFER_USE_NEXTN_DECODE"  # speculative (MTP) tokens per step; 0 turns it off
EPLB_ENV = "DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL"
JIT_CACHE_ENV = "DEEPINFER_JIT_CACHE_DIR"
EXPERT_COUNT_WINDOW = int(PINNED_DEFAULTS["DEEPINFER_EXPERT_COUNT_WINDOW_SIZE"])
MASTER_PORT_OFFSET = (
    50  # DeepInfer meets at tcp://MASTER_ADDR:(MASTER_PORT - 50 + engine_group_rank)
)
# DeepInfer's finish reasons (csrc/engine/sequence.hpp). Only the first two end a normal row.
FINISH_OK = ("stop", "length")
FINISH_ERRORS = {
    "abort": "the engine aborted the request",
    "prompt_length_exceeded": "the prompt is longer than the engine accepts (max_model_len, max_num_batched_tokens)",  # fmt: skip
    "insufficient_system_resource": "the KV cache ran short and the engine stopped the request that held the most",  # fmt: skip
    "xgrammar runtime errors or timeout": "structured output failed (grammar error or timeout)",
    "ve_error": "the vision encoder failed",
}
SM100_MAJOR = 10
INSTALL_HINT = (
    "install it on the GPU nodes with `pip install 'rollout[deepinfer]'` in a Python 3.12 "
    "environment (it builds from source: CUDA 13, GCC >= 13); see docs/deploy-deepinfer.md"
)


class DeepInferOptions(BaseModel):
    """`engine.options` for `engine.name: deepinfer` (configs/deepseek-v41-flash-8xb300.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = Field(None, description=f"Model directory; default ${MODEL_DIR_ENV}.")
    revision: str | None = Field(None, description="Model revision, recorded in the fingerprint.")
    engines_per_replica: int = Field(
        8, ge=1, le=64, description="Engines (ranks) per replica: DEP size."
    )
    gpus_per_engine: float = Field(1.0, ge=0, description="GPUs each rank reserves in Ray.")
    cpus_per_engine: float = Field(1.0, gt=0, description="CPUs each rank reserves in Ray.")
    max_num_seqs: int = Field(256, ge=1, description="Running sequences per engine.")
    max_model_len: int = Field(16384, ge=2, description="Prompt + output tokens per sequence.")
    max_num_batched_tokens: int | None = Field(
        None,
        ge=1,
        description="Tokens per step per engine: at least max_num_seqs x (1 + nextn_decode), and "
        "at least max_model_len (DeepInfer's rules); default DeepInfer's own choice.",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    nextn_decode: int = Field(
        5,
        ge=0,
        le=16,
        description=f"Speculative (MTP) tokens per decode step, {NEXTN_ENV}: outputs are "
        "deterministic at any fixed value but depend on it, so it is pinned and recorded; 0 "
        "turns speculative decoding off (DeepInfer's default is 5).",
    )
    eplb_step_interval: int | None = Field(
        None,
        ge=EXPERT_COUNT_WINDOW,
        description="Expert rearrangement (EPLB) every N decode steps; off unless set. At least "
        f"the expert count window ({EXPERT_COUNT_WINDOW}), or DeepInfer refuses to start; "
        "invariance under EPLB is not established, and it lowered throughput in a published run.",
    )
    master_port: int | None = Field(
        None,
        ge=1024 + MASTER_PORT_OFFSET,
        le=65535,
        description="MASTER_PORT of the replica: DeepInfer's ranks meet at MASTER_PORT - 50 + "
        "engine_group_rank, so concurrent replicas on one host need distinct values; default: "
        "a free rendezvous port per replica.",
    )
    jit_cache_dir: str | None = Field(
        None,
        description=f"{JIT_CACHE_ENV}: where DeepInfer keeps compiled kernels between starts "
        "(published cold start 298 s with a warm cache, 748 s without). Not in the fingerprint.",
    )
    start_timeout_s: float = Field(1800, gt=0, description="How long a replica may take to start.")

    @model_validator(mode="after")
    def _batched_tokens(self) -> DeepInferOptions:
        n = self.max_num_batched_tokens
        if n is None:
            return self
        decoding = self.max_num_seqs * (1 + self.nextn_decode)
        if n < decoding:
            raise ValueError(
                f"max_num_batched_tokens ({n}) must be at least max_num_seqs x (1 + nextn_decode) "
                f"= {decoding}"
            )
        if n < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens ({n}) must be at least max_model_len ({self.max_model_len}); "
                "DeepInfer would reject longer sequences"
            )
        return self

    def model_dir(self) -> Path:
        value = self.model or os.environ.get(MODEL_DIR_ENV)
        if not value:
            raise ConfigError(
                "engine.options.model", None, f"no model directory: set it or ${MODEL_DIR_ENV}"
            )
        return Path(value).expanduser()

    def engine_args(self) -> dict[str, Any]:
        """Keyword arguments every rank's `LLM` gets (besides engine_rank)."""
        args: dict[str, Any] = {
            "data_parallel_size": self.engines_per_replica,
            "expert_parallel_size": self.engines_per_replica,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "revision": self.revision,
            "decode_sequence": False,
        }
        if self.max_num_batched_tokens is not None:
            args["max_num_batched_tokens"] = self.max_num_batched_tokens
        return args


def deepinfer_env(options: DeepInferOptions) -> dict[str, str]:
    """The environment a rank process needs before `deepinfer` is imported: every variable
    that decides outputs, set explicitly (what is recorded in the fingerprint)."""
    env = dict(SWITCHES) | PINNED_DEFAULTS
    env[NEXTN_ENV] = str(options.nextn_decode)
    env[EPLB_ENV] = str(options.eplb_step_interval or 0)  # 0: off (DeepInfer's default)
    return env


def rank_env(options: DeepInferOptions) -> dict[str, str]:
    """deepinfer_env plus what does not change outputs (the JIT cache)."""
    env = deepinfer_env(options)
    if options.jit_cache_dir:
        env[JIT_CACHE_ENV] = options.jit_cache_dir
    return env


def apply_env(options: DeepInferOptions) -> None:
    """Set the rank environment in this process; refuse if `deepinfer` was imported before."""
    env = rank_env(options)
    if "deepinfer" in sys.modules:
        wrong = {k: os.environ.get(k) for k, v in env.items() if os.environ.get(k) != v}
        if wrong:
            raise EngineError(
                "deepinfer was imported in this process before its switches were set "
                f"({wrong}); it reads them at first use"
            )
    os.environ.update(env)


# -- preflight -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str
    driver: str


def query_gpus() -> list[Gpu]:
    """This node's NVIDIA GPUs, from nvidia-smi (the driver's own tool)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise EngineError("no NVIDIA driver found on this node (nvidia-smi is not on PATH)")
    query = "--query-gpu=name,compute_cap,driver_version"
    try:
        out = subprocess.run([exe, query, "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise EngineError(f"nvidia-smi failed: {exc}") from None
    gpus = []
    for line in out.strip().splitlines():
        name, cap, driver = (x.strip() for x in line.split(","))
        gpus.append(Gpu(name, cap, driver))
    return gpus


# What a working DeepInfer install has besides the package: its compiled extension and the
# kernel libraries its build script builds (none of them declared in its metadata).
RUNTIME_MODULES = {
    "deepinfer._C": "DeepInfer's compiled extension (built by its setup.py)",
    "deep_gemm": "DeepGEMM (built by DeepInfer's build script)",
    "deep_ep": "DeepEP (built by DeepInfer's build script)",
    "flash_mla": "FlashMLA (built by DeepInfer's build script)",
    "deep_select": "DeepSelect (built by DeepInfer's build script)",
}


def _missing_modules() -> list[str]:
    missing = []
    for module, what in RUNTIME_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(f"{module} ({what})")
    return missing


def preflight(options: DeepInferOptions, needed_gpus: int) -> list[Gpu]:
    """Everything that must hold before a replica starts, each with a specific error."""
    if importlib.util.find_spec("deepinfer") is None:
        version = ".".join(map(str, sys.version_info[:3]))
        too_old = sys.version_info < (3, 12)
        raise EngineError(
            f"the deepinfer engine needs the `deepinfer` package, which is not installed in this "
            f"Python ({version}{', and deepinfer needs Python >= 3.12' if too_old else ''}): "
            + INSTALL_HINT
        )
    missing = _missing_modules()
    if missing:
        raise EngineError(
            "the deepinfer package is installed but incomplete on this node, missing: "
            + "; ".join(missing) + ". " + INSTALL_HINT
        )  # fmt: skip
    gpus = query_gpus()
    if not gpus:
        raise EngineError("nvidia-smi lists no GPU on this node")
    wrong = [g for g in gpus if g.compute_capability.split(".")[0] != str(SM100_MAJOR)]
    if wrong:
        g = wrong[0]
        raise EngineError(
            f"DeepInfer needs SM100 GPUs (compute capability {SM100_MAJOR}.x: B200/B300); "
            f"this node has {g.name} ({g.compute_capability})"
        )
    if len(gpus) < needed_gpus:
        raise EngineError(
            f"the layout needs {needed_gpus} GPUs on one node ({options.engines_per_replica} "
            f"engines x {options.gpus_per_engine} GPUs); this node has {len(gpus)}"
        )
    model = options.model_dir()
    where = f"model directory {model} (engine.options.model or ${MODEL_DIR_ENV})"
    if not model.is_dir():
        raise EngineError(f"{where} does not exist")
    absent = [name for name in MODEL_FILES if not (model / name).is_file()]
    if absent:
        raise EngineError(f"{where} lacks {', '.join(absent)}: DeepInfer loads a folder holding {', '.join(MODEL_FILES)}")  # fmt: skip
    return gpus


def weights_checksum(model: Path) -> str:
    """sha256 over the model's config, weight index and every weight file's name and size.
    (Hashing the weights' bytes, hundreds of GiB, would add minutes to every cold start.)"""
    h = hashlib.sha256()
    for name in ("config.json", "model.safetensors.index.json"):
        if (model / name).is_file():
            h.update(name.encode() + b"\0" + (model / name).read_bytes())
    for path in sorted(model.glob("*.safetensors")):
        h.update(f"{path.name}\0{path.stat().st_size}\n".encode())
    return h.hexdigest()


# -- one rank --------------------------------------------------------------------------------
@dataclass
class RankRequest:
    """What crosses to a rank: plain values (ids, params as a dict, seed, room)."""

    index: int
    prompt_token_ids: list[int]
    params: dict[str, Any]
    seq_seed: int
    max_tokens: int
    golden: list[int] | None = None  # teacher forcing: DeepInfer's golden_token_ids


@dataclass
class RankOutput:
    index: int
    token_ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None
    finish_reason: str


def rank_versions() -> dict[str, str]:
    """Versions of what a rank computes with (torch, CUDA, DeepInfer's kernel libraries), for
    the fingerprint; '' for what is not installed."""
    import importlib
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {}
    for dist in ("deepinfer", "torch", "deep_gemm", "deep_ep", "flash_mla", "deep_select", "tilelang"):  # fmt: skip
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:  # built in place by DeepInfer's script: ask the module
            try:
                out[dist] = str(getattr(importlib.import_module(dist), "__version__", ""))
            except ImportError:
                out[dist] = ""
    try:
        import torch

        out["cuda"] = str(torch.version.cuda or "")
    except ImportError:
        out["cuda"] = ""
    return out


class DeepInferRank:
    """One `deepinfer.entrypoints.llm.LLM` (one GPU), driven by the replica."""

    def __init__(self, options: DeepInferOptions, engine_rank: int) -> None:
        self.options = options
        self.engine_rank = engine_rank
        self._llm: Any = None
        self.version = ""

    def start(self) -> None:
        apply_env(self.options)  # before the first `import deepinfer` in this process
        import deepinfer
        from deepinfer.entrypoints.llm import LLM

        self.version = str(getattr(deepinfer, "__version__", "unknown"))
        self.versions = rank_versions() | {"deepinfer": self.version}
        self._llm = LLM(
            str(self.options.model_dir()),
            engine_rank=self.engine_rank,
            seed=0,
            **self.options.engine_args(),
        )

    def tokenizer(self) -> Any:
        """The engine's own tokenizer (DeepInfer's BOS policy applied), for the replica to encode with."""
        return self._llm.get_tokenizer()

    def generate(self, requests: Sequence[RankRequest]) -> list[RankOutput]:
        """Generate this rank's share of a round. Called on every rank in every round, with
        an empty list when the rank has nothing: the engine all-reduces across the ranks at
        every step, so a rank that skipped the call would hang the others."""
        from deepinfer.sampling_params import SamplingParams as DISamplingParams

        params = []
        for r in requests:
            p = r.params
            kw: dict[str, Any] = {
                "temperature": p["temperature"],
                "top_p": p["top_p"],
                "top_k": p["top_k"],
                "ignore_eos": p["ignore_eos"],
                "max_tokens": r.max_tokens,
                "top_logprobs": p["top_logprobs"],
                "seq_seed": r.seq_seed,
            }
            if p.get("so_args") is not None:
                kw["so_args"] = p["so_args"]
            if r.golden is not None:  # the outputs are these tokens, with their logprobs
                kw["golden_token_ids"] = r.golden
                kw["ignore_eos"] = True
            params.append(DISamplingParams(**kw))
        outputs = self._llm.generate(
            prompt_token_ids=[r.prompt_token_ids for r in requests],
            sampling_params=params,
            use_tqdm=False,
        )
        return [_map(r.index, steps) for r, steps in zip(requests, outputs, strict=True)]

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()
            self._llm = None


def _map(index: int, steps: Sequence[Any]) -> RankOutput:
    """Per-token RequestOutputs (C++ objects, read-only attributes) -> one RankOutput."""
    tokens = [int(s.token_id) for s in steps]
    logprobs = [float(s.token_logprobs) for s in steps]
    top = None
    if steps and len(steps[0].top_token_ids):
        top = [list(zip(map(int, s.top_token_ids), map(float, s.top_logprobs), strict=True))
               for s in steps]  # fmt: skip
    reason = str(steps[-1].finish_reason) if steps else ""
    return RankOutput(index, tokens, logprobs, top, reason)


# -- the service's side: requests in, results out --------------------------------------------
def prepare(request: GenerationRequest, index: int, max_model_len: int) -> RankRequest:
    """Validate one request and turn it into a rank request (ids truncated, room capped)."""
    params = request.params
    prompt = prepare_prompt(request, max_model_len)
    if request.forced_output is not None:
        golden = check_forced(request, prompt, max_model_len, vocab=2**31 - 1)
        return RankRequest(index, prompt, params.model_dump(), request.seq_seed, len(golden), golden)  # fmt: skip
    max_new = min(params.max_tokens, max_model_len - len(prompt))
    return RankRequest(index, prompt, params.model_dump(), request.seq_seed, max_new)


def finish(
    request: GenerationRequest,
    prepared: RankRequest,
    out: RankOutput,
    eos: frozenset[int],
    decode: Any,
) -> GenerationResult:
    """Apply the shared stop rules to a rank's tokens; the result every engine returns."""
    params = request.params
    if out.finish_reason not in FINISH_OK:
        # rejected or stopped by the engine: an error of this row, never a normal one (a
        # rejected prompt's one output is its last prompt token, not generated text)
        detail = FINISH_ERRORS.get(out.finish_reason, "the engine ended it with an unknown reason")
        raise RowError(request.request_id, out.finish_reason, detail)
    if prepared.golden is not None:  # teacher forced: the given tokens, no stop rules
        return GenerationResult(
            request_id=request.request_id, prompt_token_ids=prepared.prompt_token_ids,
            output_token_ids=list(out.token_ids), output_text=decode(out.token_ids),
            finish_reason="length", output_logprobs=out.logprobs if params.logprobs else None,
            top_logprobs=out.top if out.top is not None and params.top_logprobs else None,
        )  # fmt: skip
    stop = StopState(params, eos, prepared.max_tokens, decode)
    for token in out.token_ids:
        if stop.append(token):
            break
    n = len(stop.token_ids)
    if stop.finish_reason is None:  # DeepInfer ended it (EOS, or max_tokens) before our rules did
        stop.finish_reason = out.finish_reason  # type: ignore[assignment]
    return GenerationResult(
        request_id=request.request_id,
        prompt_token_ids=prepared.prompt_token_ids,
        output_token_ids=list(stop.token_ids),
        output_text=stop.output_text(),
        finish_reason=stop.finish_reason,
        output_logprobs=out.logprobs[:n] if params.logprobs else None,
        top_logprobs=out.top[:n] if out.top is not None and params.top_logprobs else None,
    )


def fingerprint(
    options: DeepInferOptions, versions: dict[str, str], gpus: list[Gpu]
) -> dict[str, Any]:
    model = options.model_dir()
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    return {
        "engine": "deepinfer",
        "engine_version": ADAPTER_VERSION,
        "deepinfer_version": versions.get("deepinfer", ""),
        "versions": dict(sorted(versions.items())),  # torch, CUDA, the kernel libraries
        "model": config.get("_name_or_path") or model.name,
        "model_revision": options.revision,
        "weights_checksum": weights_checksum(model),
        "switches": deepinfer_env(options),
        "layout": {
            "engines_per_replica": options.engines_per_replica,
            "gpus_per_engine": options.gpus_per_engine,
        },  # fmt: skip
        "max_model_len": options.max_model_len,
        "gpu": sorted({g.name for g in gpus}),
        "driver": sorted({g.driver for g in gpus}),
    }
