"""The soak benchmark's short variant: one service, 60 s of mixed submissions,
cancellations, bad specs and watches (scripts/bench_soak.py), nothing unexpected, and the
service's memory, file descriptors and processes flat."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_soak.py"


def test_soak_60_seconds(tmp_path):
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--seconds", "60", "--sample-every", "3",
                           "--json", str(out)], capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    f = json.loads(out.read_text())
    assert f["unexpected"] == []
    # every job ended as the soak expected (the script checks each one and its digest)
    ended = f["ended"]
    assert ended["A"].get("SUCCEEDED", 0) >= 3
    assert set(ended["A"]) == {"SUCCEEDED"} and set(ended["B"]) <= {"SUCCEEDED", "CANCELLED"}
    assert f["cancels"] >= 1 and f["refused_bad_specs"] >= 1 and f["watches"] >= 1
    assert len(f["samples"]) >= 10
    # flat: generous bounds between the first and last quarter after warm-up
    assert f["rss_mib_last_quarter"] < f["rss_mib_first_quarter"] + 64
    assert f["fds_last_quarter"] < f["fds_first_quarter"] + 16
    assert f["processes_last_quarter"] <= f["processes_first_quarter"] + 4
