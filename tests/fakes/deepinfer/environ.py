"""Stand-in for deepinfer.environ: the variables this stand-in models, with the real defaults
(read at first use, as the real `envs` does). The contract test compares them with the real
environ.py."""

import os

DEFAULTS = {
    "DEEPINFER_BATCH_INVARIANT": False,
    "DEEPINFER_ENABLE_MTP_VARLEN": False,
    "DEEPINFER_USE_NEXTN_DECODE": 5,
    "DEEPINFER_SAMPLER_FORCE_TOPK": 0,
    "DEEPINFER_DECODE_TOKEN_BLACKLIST": "",
    "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE": "off",
    "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS": 0,
    "DEEPINFER_DFLASH_CONFIDENCE_HEAD_TEMPERATURE": 1.0,
    "DEEPINFER_EXPERT_COUNT_WINDOW_SIZE": 100,
    "DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL": 0,
    "DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS": 0,
    "DEEPINFER_USE_MULTIMODAL_POOL": False,
    "DEEPINFER_JIT_CACHE_DIR": None,
    "DEEPINFER_GLOO_TIMEOUT": 14400.0,
}


def _parse(name, raw):
    default = DEFAULTS[name]
    if raw is None:
        return default
    if isinstance(default, bool):
        return raw not in ("0", "", "false", "False")
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, float):
        return float(raw)
    return raw


class _Envs:
    def __getattr__(self, name):
        if name not in DEFAULTS:
            raise AttributeError(name)
        value = _parse(name, os.environ.get(name))
        setattr(self, name, value)  # read at first use, then fixed
        return value


envs = _Envs()
