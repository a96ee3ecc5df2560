"""The stand-in (tests/fakes/deepinfer) against the real deepinfer 0.1.0 source, and the
adapter's facts (pinned variables, finish reasons) against it too.

The real source distribution is fetched (pinned version and sha256, cached) and read with
`ast`, never imported or built. The stand-in is read in a subprocess that has it on its
path (this process must not import a `deepinfer`). Any difference in the surface fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from rollout.engines import deepinfer as adapter
from tests.conftest import FAKES
from tests.engines import deepinfer_sdist as sdist

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real():
    try:
        sdist.fetch()
    except sdist.Unavailable as exc:
        pytest.skip(str(exc))
    return sdist


SURFACE = r"""
import inspect, json
import deepinfer
from deepinfer._C.engine import RequestOutput
from deepinfer.entrypoints import llm
from deepinfer.sampling_params import SamplingParams

def sig(fn):
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        if p.kind is p.VAR_KEYWORD:
            out["**"] = p.name
        else:
            out[p.name] = "<required>" if p.default is p.empty else p.default
    return out

print(json.dumps({
    "sampling_params": sig(SamplingParams.__init__),
    "llm": {m: sig(getattr(llm.LLM, m)) for m in ("__init__", "generate", "get_tokenizer", "close")},
    "request_output": {
        "attributes": sorted(n for n, v in vars(RequestOutput).items() if isinstance(v, property)),
        "static": sorted(n for n, v in vars(RequestOutput).items() if isinstance(v, staticmethod)),
    },
    "finish_reasons": list(llm.FINISH_REASONS),
    "environ": deepinfer.environ.DEFAULTS,
}))
"""


@pytest.fixture(scope="module")
def stand_in() -> dict:
    env = dict(os.environ, PYTHONPATH=str(FAKES))
    out = subprocess.run([sys.executable, "-c", SURFACE], env=env, capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout)


def test_sampling_params_signature_and_defaults(real, stand_in):
    assert stand_in["sampling_params"] == real.sampling_params_signature()


def test_llm_signatures(real, stand_in):
    assert stand_in["llm"] == real.llm_signatures()


def test_request_output_fields_are_attributes_with_the_real_accessors(real, stand_in):
    members = real.request_output_members()
    assert sorted(members["attributes"]) == stand_in["request_output"]["attributes"]
    assert sorted(members["static"]) == stand_in["request_output"]["static"]
    assert {"token_id", "token_logprobs", "top_token_ids", "finish_reason"} <= members["attributes"]


def test_finish_reasons(real, stand_in):
    reasons = real.finish_reasons()
    assert stand_in["finish_reasons"] == reasons
    # the adapter knows every one: two end a row, the rest are errors of that row
    assert [*adapter.FINISH_OK, *adapter.FINISH_ERRORS] == reasons


def test_the_stand_in_models_variables_with_their_real_defaults(real, stand_in):
    defaults = real.environ_defaults()
    assert len(defaults) > 50  # the whole class was read
    differ = {k: (v, defaults.get(k, "<absent>")) for k, v in stand_in["environ"].items()
              if defaults.get(k, "<absent>") != v}  # fmt: skip
    assert not differ, f"stand-in default vs real: {differ}"


def _as_env(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return "" if value is None else str(value)


def test_the_adapter_pins_real_variables_at_their_real_defaults(real):
    defaults = real.environ_defaults()
    named = set(adapter.SWITCHES) | set(adapter.PINNED_DEFAULTS) | {
        adapter.NEXTN_ENV, adapter.EPLB_ENV, adapter.JIT_CACHE_ENV}  # fmt: skip
    assert named <= set(defaults), f"not variables of DeepInfer 0.1.0: {named - set(defaults)}"
    assert {k: _as_env(defaults[k]) for k in adapter.PINNED_DEFAULTS} == adapter.PINNED_DEFAULTS
    assert defaults["DEEPINFER_EXPERT_COUNT_WINDOW_SIZE"] == adapter.EXPERT_COUNT_WINDOW
    assert adapter.DeepInferOptions().nextn_decode == defaults[adapter.NEXTN_ENV]
    # the variables DEEPINFER.md names as changing outputs are all pinned or options
    outputs = {"DEEPINFER_USE_NEXTN_DECODE", "DEEPINFER_SAMPLER_FORCE_TOPK",
               "DEEPINFER_DECODE_TOKEN_BLACKLIST", "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE",
               "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "DEEPINFER_DFLASH_CONFIDENCE_HEAD_TEMPERATURE",
               "DEEPINFER_EXPERT_COUNT_WINDOW_SIZE", "DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS",
               "DEEPINFER_BATCH_INVARIANT", "DEEPINFER_ENABLE_MTP_VARLEN",
               "DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL", "DEEPINFER_USE_MULTIMODAL_POOL"}  # fmt: skip
    assert outputs <= set(adapter.deepinfer_env(adapter.DeepInferOptions()))


def test_our_requirements_admit_every_version_deepinfer_pins(real):
    """`pip install 'rollout[deepinfer]'` must be resolvable: every package both need is
    given a range that holds deepinfer's exact pin (read from the sdist's metadata)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    pins = {canonicalize_name(k): v for k, v in real.requires_dist().items()}
    shared = sorted(set(ours) & set(pins))
    assert {"transformers", "tokenizers", "numpy", "tqdm", "safetensors"} <= set(shared)
    refused = {name: f"{ours[name].specifier} excludes {pins[name]}"
               for name in shared if not ours[name].specifier.contains(pins[name])}  # fmt: skip
    assert not refused, refused


def _python312() -> str | None:
    import shutil

    for candidate in (shutil.which("python3.12"), "/root/.pyenv/versions/3.12.1/bin/python3.12"):
        if candidate and Path(candidate).is_file():
            probe = subprocess.run([candidate, "-c", "import pip"], capture_output=True)
            if probe.returncode == 0:
                return candidate
    return None


@pytest.mark.slow
def test_pip_resolves_rollout_beside_every_deepinfer_pin_on_python_312(real, tmp_path):
    """What `pip install 'rollout[deepinfer]'` must resolve on a GPU node: this project (its
    ranges), every exact pin of deepinfer's metadata, and torch 2.13.0, on Python 3.12.
    (deepinfer itself is left out: its setup.py needs torch and CUDA to build metadata.)"""
    python = _python312()
    if python is None:
        pytest.skip("no Python 3.12 with pip on this machine")
    pins = tmp_path / "deepinfer-pins.txt"
    pins.write_text("".join(f"{k}=={v}\n" for k, v in real.requires_dist().items()))
    report = tmp_path / "report.json"
    done = subprocess.run(
        [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), "-r", str(pins), "torch==2.13.0", "-e", str(ROOT)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0 and "Could not fetch URL" in done.stderr:
        pytest.skip(f"the package index cannot be reached: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"]
              for i in json.loads(report.read_text())["install"]}  # fmt: skip
    for name, version in real.requires_dist().items():
        assert chosen[name.lower().replace("_", "-")] == version, name
    assert chosen["rollout"] == "0.1.0" and chosen["torch"].startswith("2.13.0")
