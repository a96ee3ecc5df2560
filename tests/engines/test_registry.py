"""Engines are chosen by name from a lazy registry."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rollout.engines import ENGINES, create_engine, engine_class
from rollout.errors import ConfigError


def test_unknown_engine_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        engine_class("vllm")
    assert err.value.parameter == "engine.name"
    assert "unknown engine 'vllm'; valid engines: " + ", ".join(sorted(ENGINES)) in str(err.value)


def test_registry_imports_no_engine_until_chosen():
    code = (
        "import sys, rollout.engines, rollout.cli.main\n"
        "heavy = [m for m in ('torch', 'transformers', 'rollout.engines.smollm2', 'deepinfer') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_engine_options_are_validated_by_name():
    with pytest.raises(ConfigError) as err:
        create_engine("smollm2", max_num_seqs=0)
    assert err.value.parameter == "engine.options.max_num_seqs"
    with pytest.raises(ConfigError) as err:
        create_engine("smollm2", batch=4)
    assert err.value.parameter == "engine.options.batch"
