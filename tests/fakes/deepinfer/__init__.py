"""Fake deepinfer 0.1.0 for contract tests (see tests/fakes/README.md)."""

import os

__version__ = "0.1.0"

# What the process environment held when deepinfer was first imported: the switches
# are read at first use, so this is what the engine runs with.
IMPORT_ENV = {
    k: os.environ.get(k)
    for k in (
        "DEEPINFER_BATCH_INVARIANT",
        "DEEPINFER_ENABLE_MTP_VARLEN",
        "DEEPINFER_EXPERT_REARRANGEMENT_STEP_INTERVAL",
        "CUDA_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
    )
}
