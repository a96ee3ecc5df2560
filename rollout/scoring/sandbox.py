"""Running one untrusted program in a sandboxed subprocess (the runner is sandbox_child.py).

Never in the calling process: a child Python (`-I -S`: no site-packages, no environment)
in its own session and temporary folder, with limits on CPU time, memory, file size,
open files and (once it is `nobody`) processes; its own network namespace where the
kernel allows, and an audit hook refusing process starts, sockets, C libraries and
writes outside its folder in any case. It is killed (its whole process group) at the
wall-clock limit. The verdict is one of passed, failed, timeout, error, with a short
reason that depends only on the program (no paths, no addresses, no timings).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("sandbox_child.py")
NOBODY = 65534


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # CPU seconds; the wall clock allows twice this plus 5 s
    memory_mb: int = 1024
    file_mb: int = 1  # the most any file (stdout included) may hold
    nproc: int = 16
    python: str = sys.executable


@dataclass(frozen=True)
class Verdict:
    status: str  # passed | failed | timeout | error
    reason: str = ""

    @property
    def detail(self) -> str:
        return f"{self.status}: {self.reason}" if self.reason else self.status


def run_program(source: str, limits: Limits, tmp_root: str | None = None) -> Verdict:
    """Run `source` as a program in the sandbox; its verdict."""
    folder = Path(tempfile.mkdtemp(prefix="rollout-sandbox-", dir=tmp_root))
    try:
        (folder / "program.py").write_text(source, encoding="utf-8")
        drop = os.geteuid() == 0 and _readable_by_others(limits.python)
        if drop:  # the program runs as nobody: its folder is all it may write
            os.chown(folder, NOBODY, NOBODY)
        return _run(folder, limits, drop)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def _readable_by_others(python: str) -> bool:
    """Whether `nobody` could run `python` with its standard library (a Python under /root,
    as pyenv installs it for root, cannot be): only then are root's privileges dropped."""
    import sysconfig

    paths = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["platstdlib"]) / "lib-dynload"]  # fmt: skip
    for path in paths:
        for part in [path, *path.parents]:
            try:
                mode = part.stat().st_mode
            except OSError:
                return False
            if not mode & 0o001 or (part == path and not mode & 0o004):
                return False
    return True


def _run(folder: Path, limits: Limits, drop: bool) -> Verdict:
    nonce = secrets.token_hex(16)
    read_end, write_end = os.pipe()
    cfg = {"cpu_s": max(1, int(limits.timeout_s + 0.999)), "memory_mb": limits.memory_mb,
           "file_mb": limits.file_mb, "nproc": limits.nproc, "uid": NOBODY if drop else None, "fd": write_end}  # fmt: skip
    with open(folder / "stdout.txt", "wb") as out, open(folder / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(
            [limits.python, "-I", "-S", "-B", str(CHILD), json.dumps(cfg)],
            cwd=folder, stdin=subprocess.PIPE, stdout=out, stderr=err, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            start_new_session=True, pass_fds=(write_end,), close_fds=True,
        )  # fmt: skip
    os.close(write_end)
    try:
        proc.stdin.write(nonce.encode())  # type: ignore[union-attr]
        proc.stdin.close()  # type: ignore[union-attr]
    except BrokenPipeError:
        pass
    timed_out = False
    try:
        proc.wait(timeout=2 * limits.timeout_s + 5)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc)
    with os.fdopen(read_end, "rb") as f:
        said = f.read(4096).decode("utf-8", "replace")
    code = proc.returncode
    if said == nonce and code == 0:
        return Verdict("passed")
    if timed_out or code in (-signal.SIGXCPU, -signal.SIGKILL) and not said:
        return Verdict("timeout", f"over {limits.timeout_s:g} s")
    if code == -signal.SIGXFSZ:
        return Verdict("error", f"output over {limits.file_mb} MiB")
    if said.startswith("error:"):
        return Verdict("error", said[6:])
    if said.startswith("failed:"):
        return Verdict("failed", said[7:])
    if code is not None and code < 0:
        return Verdict("error", f"killed by {signal.Signals(-code).name}")
    return Verdict("failed", f"exit {code}")


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill what is left of the program's session (it may have no members left)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
