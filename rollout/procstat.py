"""A process's peak memory, as the benchmarks and the memory tests measure it."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

# `rollout <args>` in a fresh interpreter, reporting its exit code and peak RSS on stderr
_MEASURED = """
import json, sys
from rollout.cli.main import main
from rollout.procstat import peak_rss_mib
code = main(sys.argv[1:])
print(json.dumps({"code": code, "peak_rss_mib": peak_rss_mib()}), file=sys.stderr)
sys.exit(code)
"""


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM), in MiB. Not getrusage's ru_maxrss
    where /proc exists: that survives exec, so a child started from a large process
    would report the parent's size."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_cli_measured(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Run `rollout <args>` in a fresh process; its result and its peak RSS in MiB."""
    proc = subprocess.run([sys.executable, "-c", _MEASURED, *args], capture_output=True,
                          text=True, check=False)  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"`rollout {' '.join(args)}` failed:\n{proc.stderr[-3000:]}")
    return proc, json.loads(lines[-1])["peak_rss_mib"]
