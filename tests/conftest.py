"""Shared fixtures: the real SmolLM2 engine, loaded once per session and batch size."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

FAKES = Path(__file__).parent / "fakes"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm2_factory() -> Iterator[Callable[..., object]]:
    """smollm2 engines by options; each distinct set of options is started once."""
    from rollout.engines import create_engine

    engines: dict[tuple, object] = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in engines:
            engine = create_engine("smollm2", **options)
            engine.start()
            engines[key] = engine
        return engines[key]

    yield get
    for engine in engines.values():
        engine.close()


@pytest.fixture(scope="session")
def smollm2(smollm2_factory):
    return smollm2_factory()


@pytest.fixture(scope="session")
def ray_runtime():
    """A real local Ray runtime, started once, as `rollout run` starts it."""
    import ray

    from rollout.runtime import cluster

    # Processes started from here on (Ray's workers among them) find the fake deepinfer
    # and nvidia-smi of tests/fakes; this process does not (its sys.path is fixed), so
    # "deepinfer is not installed" stays testable here.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(FAKES), os.environ.get("PYTHONPATH")])
    )
    os.environ["PATH"] = f"{FAKES / 'bin'}{os.pathsep}{os.environ['PATH']}"
    cluster.connect(None)
    yield ray
    ray.shutdown()
