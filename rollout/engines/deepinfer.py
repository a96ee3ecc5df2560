"""DeepInfer 0.1.0 (shared/DEEPINFER.md): one engine rank, the `LLM` of one GPU.

What this module owns, and where each fact lives:
- the determinism switches, set in the process environment before `deepinfer` is
  imported (`deepinfer_env`); DeepInfer reads them at first use;
- the preflight: clear errors before any heavy work (`preflight`);
- the adapter (`DeepInferRank`): our requests in as `prompt_token_ids`, each with its
  own `SamplingParams(seq_seed=...)`, `decode_sequence=False`; the per-token
  `RequestOutput`s mapped back. DeepInfer has no stop strings, stop token ids or `n`:
  the service expands `n` into requests and ends sequences with the shared StopState,
  exactly as for every engine.
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

from pydantic import BaseModel, ConfigDict, Field

from rollout.engines.base import GenerationRequest, GenerationResult, prepare_prompt
from rollout.engines.stopping import StopState
from rollout.errors import ConfigError, EngineError

ADAPTER_VERSION = "1"
MODEL_DIR_ENV = "DEEPINFER_HF_MODEL_DIR"
SWITCHES = {"DEEPINFER_BATCH_INVARIANT": "1", "DEEPINFER_ENABLE_MTP_VARLEN": "0"}
EPLB_ENV = "DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL"
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
        None, ge=1, description="Tokens per step per engine."
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    eplb_step_interval: int | None = Field(
        None, ge=1, description="Expert rearrangement (EPLB) every N steps; off unless set."
    )
    master_port: int | None = Field(
        None, ge=1024, le=65535, description="Rendezvous port; default: a free port per replica."
    )
    start_timeout_s: float = Field(1800, gt=0, description="How long a replica may take to start.")

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
    """The environment a rank process needs before `deepinfer` is imported."""
    env = dict(SWITCHES)
    if options.eplb_step_interval is not None:
        env[EPLB_ENV] = str(options.eplb_step_interval)
    return env


def apply_env(options: DeepInferOptions) -> None:
    """Set the switches in this process; refuse if `deepinfer` was imported without them."""
    env = deepinfer_env(options)
    if "deepinfer" in sys.modules:
        wrong = {k: os.environ.get(k) for k, v in env.items() if os.environ.get(k) != v}
        if wrong or (EPLB_ENV not in env and os.environ.get(EPLB_ENV)):
            raise EngineError(
                "deepinfer was imported in this process before its determinism switches were "
                f"set ({wrong or {EPLB_ENV: os.environ.get(EPLB_ENV)}}); it reads them at first use"
            )
    os.environ.update(env)
    if EPLB_ENV not in env:
        os.environ.pop(EPLB_ENV, None)


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
    if not (model / "config.json").is_file():
        what = "does not exist" if not model.exists() else "has no config.json"
        raise EngineError(
            f"model directory {model} (engine.options.model or ${MODEL_DIR_ENV}) {what}"
        )
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


@dataclass
class RankOutput:
    index: int
    token_ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]] | None
    finish_reason: str


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
        self._llm = LLM(
            str(self.options.model_dir()),
            engine_rank=self.engine_rank,
            seed=0,
            **self.options.engine_args(),
        )

    def generate(self, requests: Sequence[RankRequest]) -> list[RankOutput]:
        """Generate this rank's share of a step; every rank is called, even with none."""
        from deepinfer.sampling_params import SamplingParams as DISamplingParams

        if not requests:
            return []
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
    """Per-token RequestOutputs (C++ objects; fields are methods) -> one RankOutput."""
    tokens = [int(s.token_id()) for s in steps]
    logprobs = [float(s.token_logprobs()) for s in steps]
    top = None
    if steps and len(steps[0].top_token_ids()):
        top = [list(zip(map(int, s.top_token_ids()), map(float, s.top_logprobs()), strict=True))
               for s in steps]  # fmt: skip
    reason = str(steps[-1].finish_reason()) if steps else "length"
    return RankOutput(index, tokens, logprobs, top, reason)


# -- the service's side: requests in, results out --------------------------------------------
def prepare(request: GenerationRequest, index: int, max_model_len: int) -> RankRequest:
    """Validate one request and turn it into a rank request (ids truncated, room capped)."""
    params = request.params
    prompt = prepare_prompt(request, max_model_len)
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
    stop = StopState(params, eos, prepared.max_tokens, decode)
    for token in out.token_ids:
        if stop.append(token):
            break
    n = len(stop.token_ids)
    if stop.finish_reason is None:  # DeepInfer ended it (EOS) before our rules did
        stop.finish_reason = "stop" if "length" not in out.finish_reason.lower() else "length"
    return GenerationResult(
        request_id=request.request_id,
        prompt_token_ids=prepared.prompt_token_ids,
        output_token_ids=list(stop.token_ids),
        output_text=stop.output_text(),
        finish_reason=stop.finish_reason,
        output_logprobs=out.logprobs[:n] if params.logprobs else None,
        top_logprobs=out.top[:n] if out.top is not None and params.top_logprobs else None,
    )


def fingerprint(options: DeepInferOptions, version: str, gpus: list[Gpu]) -> dict[str, Any]:
    model = options.model_dir()
    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    return {
        "engine": "deepinfer",
        "engine_version": ADAPTER_VERSION,
        "deepinfer_version": version,
        "model": config.get("_name_or_path") or model.name,
        "model_revision": options.revision,
        "weights_checksum": weights_checksum(model),
        "switches": deepinfer_env(options) | {EPLB_ENV: str(options.eplb_step_interval or "off")},
        "layout": {
            "engines_per_replica": options.engines_per_replica,
            "gpus_per_engine": options.gpus_per_engine,
        },  # fmt: skip
        "max_model_len": options.max_model_len,
        "gpu": sorted({g.name for g in gpus}),
        "driver": sorted({g.driver for g in gpus}),
    }
