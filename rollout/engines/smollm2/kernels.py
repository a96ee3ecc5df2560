"""The smollm2 engine's fixed-order CPU kernels (`kernels.c`), built once and called with ctypes.

Every reduction the forward pass and the sampler make (GEMMs, RMSNorm, attention,
softmax sums) is summed here in an order fixed by its length alone, so a row's bits do
not depend on the rows beside it, the thread count, the SIMD width or the BLAS. The
AVX2 and portable implementations give the same bits; `ROLLOUT_KERNELS=generic` forces
the portable one (the tests run both).

The library is compiled on first use with the system C compiler (`$CC`, else `cc`) into
`$ROLLOUT_CACHE/kernels/<hash of source, flags, compiler>/`, written to a temporary name
and renamed, so concurrent engine processes never load a half-written file. `make
install` builds it ahead (`main()`).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import numpy as np
import torch

from rollout.engines.smollm2.weights import cache_root
from rollout.errors import EngineError

SOURCE = Path(__file__).with_name("kernels.c")
# -ffp-contract=off: the compiler must not fuse a * b + c where the source does not.
FLAGS = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-fno-fast-math"]
KERNELS_VERSION = "rollout-cpu-kernels-v1"
_P = ctypes.c_void_p
_L = ctypes.c_long
_I = ctypes.c_int


def _compiler() -> str:
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if not cc:
        raise EngineError(
            "the smollm2 engine compiles its CPU kernels with a C compiler, and none was found "
            "(set CC or install gcc: `apt-get install gcc`)"
        )
    return cc


def _library_path(cc: str, flags: list[str]) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode() + version.encode())
    return cache_root() / "kernels" / key.hexdigest()[:20] / "librollout_kernels.so"


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the kernels unless this source, these flags and this compiler built them already.

    `extra_flags=("-DROLLOUT_PORTABLE_ONLY",)` builds only the plain C path (fmaf from the
    C library), which the tests compare with the default build."""
    flags = [*FLAGS, *extra_flags]
    cc = _compiler()
    target = _library_path(cc, flags)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # torch ships its own OpenMP runtime: link against it so that one thread pool serves both
    torch_lib = Path(torch.__file__).parent / "lib"
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cc, *flags, "-o", tmp, str(SOURCE), "-lm"]
    if (torch_lib / "libgomp.so.1").exists():
        cmd += [f"-Wl,-rpath,{torch_lib}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise EngineError(
                f"compiling {SOURCE.name} failed ({' '.join(cmd)}):\n{done.stderr.strip()}"
            )
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_active: tuple[str, ...] = ()  # the extra build flags of the library in use


@contextlib.contextmanager
def using_build(extra_flags: tuple[str, ...]) -> Iterator[None]:
    """Run the kernels of another build of the same source (the tests' portable-only one)."""
    global _active
    before, _active = _active, extra_flags
    try:
        yield
    finally:
        _active = before


def _lib() -> ctypes.CDLL:
    return _load(_active)


@cache
def _load(extra_flags: tuple[str, ...]) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build(extra_flags)))
    lib.rl_gemm.argtypes = [_P, _L, _I, _P, _L, _I, _I, _P, _L, _I, _I]
    lib.rl_rms_norm.argtypes = [_P, _L, _I, _I, _P, ctypes.c_float, _P, _L, _I, _I]
    lib.rl_silu_mul.argtypes = [_P, _L, _I, _I, _P, _L, _I, _I]
    lib.rl_exp_shifted.argtypes = [_P, _I, ctypes.c_float, _P, _I]
    lib.rl_exp_shifted.restype = ctypes.c_double
    lib.rl_log.argtypes = [ctypes.c_double]
    lib.rl_log.restype = ctypes.c_double
    lib.rl_attention.argtypes = [_I, _I, _I, _I, _I, _P, _L, _P, _L, _P, _L, _P, _P, _P, _P, _L, _I, _I]  # fmt: skip
    return lib


def simd() -> int:
    """1 when the AVX2+FMA kernels run, 0 for the portable ones (forced by ROLLOUT_KERNELS=generic)."""
    return _simd(_active)


@cache
def _simd(extra_flags: tuple[str, ...]) -> int:
    choice = os.environ.get("ROLLOUT_KERNELS", "auto")
    if choice not in ("auto", "generic"):
        raise EngineError(f"ROLLOUT_KERNELS must be auto or generic, got {choice!r}")
    return 0 if choice == "generic" else int(_load(extra_flags).rl_has_avx2())


def path_name() -> str:
    return "avx2+fma" if simd() else "portable C"


def _threads() -> int:
    return torch.get_num_threads()


def _check(t: torch.Tensor, name: str) -> None:
    if t.dtype != torch.float32 or t.dim() != 2 or t.stride(1) != 1:
        raise ValueError(f"{name}: a 2-D float32 tensor with contiguous rows is needed")


def gemm(
    x: torch.Tensor, w: torch.Tensor, threads: int | None = None, path: int | None = None
) -> torch.Tensor:
    """x @ w.T, each output summed in the fixed order (`path`: 1 AVX2, 0 portable, None auto)."""
    _check(x, "x")
    _check(w, "w")
    (m, k), n = x.shape, w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"gemm: x has {k} columns, w has {w.shape[1]}")
    y = torch.empty(m, n)
    _lib().rl_gemm(x.data_ptr(), x.stride(0), m, w.data_ptr(), w.stride(0), n, k,
                   y.data_ptr(), n, threads or _threads(), simd() if path is None else path)  # fmt: skip
    return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check(x, "x")
    m, k = x.shape
    y = torch.empty(m, k)
    _lib().rl_rms_norm(x.data_ptr(), x.stride(0), m, k, weight.data_ptr(), eps,
                       y.data_ptr(), k, _threads(), simd())  # fmt: skip
    return y


def silu_mul(gate_up: torch.Tensor, inter: int) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dimension."""
    _check(gate_up, "gate_up")
    m = gate_up.shape[0]
    out = torch.empty(m, inter)
    _lib().rl_silu_mul(gate_up.data_ptr(), gate_up.stride(0), m, inter,
                       out.data_ptr(), inter, _threads(), simd())  # fmt: skip
    return out


def exp_shifted(x: np.ndarray, m: float) -> tuple[np.ndarray, float]:
    """exp(x - m) of a float32 row (the sampler's unnormalised probabilities) and their
    float64 sum, both in the fixed order."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    probs = np.empty_like(x)
    total = _lib().rl_exp_shifted(x.ctypes.data, x.shape[0], float(m), probs.ctypes.data, simd())
    return probs, total


def log(x: float) -> float:
    """Natural log in float64 by a fixed sequence of operations (no libm variant decides it)."""
    return _lib().rl_log(x)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layer: int,
    cache_ptrs: np.ndarray,
    caps: np.ndarray,
    positions: np.ndarray,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    """Write each row's k and v at its position in its sequence's cache, then attend.

    q: (rows, heads * head_dim), already scaled by 1/sqrt(head_dim); k, v: (rows,
    kv_heads * head_dim); cache_ptrs, caps, positions: per row (int64, int64, int32).
    """
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _check(t, name)
    rows = q.shape[0]
    out = torch.empty(rows, heads * head_dim)
    _lib().rl_attention(
        rows, heads, kv_heads, head_dim, layer,
        q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
        cache_ptrs.ctypes.data, caps.ctypes.data, positions.ctypes.data,
        out.data_ptr(), out.stride(0), _threads(), simd(),
    )  # fmt: skip
    return out


def main() -> None:
    """`make install`: build ahead of the first engine start."""
    path = build()
    print(f"built {path} ({path_name()} kernels on this CPU)", file=sys.stderr)
