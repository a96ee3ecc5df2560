"""The generated gRPC code for proto/rollout/v1/rollout.proto.

Generated at install time (`make install` runs `python -m rollout.api.proto`) into
`rollout/api/_gen/`, which git ignores; if it is missing or older than the .proto,
the first import compiles it (grpcio-tools, about 0.1 s).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "proto"
PROTO = PROTO_DIR / "rollout" / "v1" / "rollout.proto"
GEN = Path(__file__).resolve().parent / "_gen"


def generate() -> None:
    from grpc_tools import protoc

    GEN.mkdir(exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    code = protoc.main([
        "grpc_tools.protoc", f"-I{PROTO_DIR}", f"-I{include}", f"--python_out={GEN}",
        f"--grpc_python_out={GEN}", str(PROTO),
    ])  # fmt: skip
    if code != 0:
        raise RuntimeError(f"protoc failed on {PROTO} (exit {code})")


def _stale() -> bool:
    out = GEN / "rollout" / "v1" / "rollout_pb2.py"
    return not out.exists() or (PROTO.exists() and out.stat().st_mtime < PROTO.stat().st_mtime)


def modules() -> tuple[ModuleType, ModuleType]:
    """(rollout_pb2, rollout_pb2_grpc)."""
    if _stale():
        generate()
    # The generated modules import each other as `rollout.v1.*` (the proto's path):
    # let the `rollout` package find `v1` in the generated tree.
    import rollout

    if str(GEN / "rollout") not in rollout.__path__:
        rollout.__path__.append(str(GEN / "rollout"))
    return importlib.import_module("rollout.v1.rollout_pb2"), importlib.import_module(
        "rollout.v1.rollout_pb2_grpc"
    )


if __name__ == "__main__":
    generate()
    print(f"generated {GEN}")
