"""Every diagnostic goes through logging, in one format chosen on the command line: JSON
lines a log collector can parse, or text lines; the level filters them."""

from __future__ import annotations

import json
import subprocess
import sys


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollout.cli.main", *args], capture_output=True, text=True, timeout=300)  # fmt: skip


def test_json_text_and_level():
    gen = ("generate", "--chat", "hi", "--max-tokens", "2", "--temperature", "0")
    as_json = run("--log-format", "json", *gen)
    assert as_json.returncode == 0, as_json.stderr[-1000:]
    records = [json.loads(line) for line in as_json.stderr.splitlines() if line.strip()]
    ready = [r for r in records if "engine ready" in r["message"]]
    assert (
        ready
        and ready[0]["level"] == "INFO"
        and ready[0]["logger"] == "rollout.engines.smollm2.engine"
    )
    assert set(ready[0]) >= {"time", "level", "logger", "message", "pid"}
    as_text = run(*gen)
    assert " INFO rollout.engines.smollm2.engine: smollm2 engine ready in " in as_text.stderr
    quiet = run("--log-level", "warning", *gen)
    assert "engine ready" not in quiet.stderr and quiet.stdout.strip()
    bad = run("--log-level", "loud", *gen)
    assert bad.returncode == 2 and "invalid --log-level: must be one of" in bad.stderr
