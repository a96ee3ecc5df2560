"""Stand-in for deepinfer 0.1.0 (see tests/fakes/README.md), checked against the real source
by tests/engines/test_deepinfer_contract.py."""

import os

from deepinfer.environ import DEFAULTS, envs  # noqa: F401

__version__ = "0.1.0"

# What the process environment held when deepinfer was first imported: the switches are read
# at first use, so this is what the engine runs with.
IMPORT_ENV = {
    k: os.environ.get(k) for k in (*DEFAULTS, "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT")
}
