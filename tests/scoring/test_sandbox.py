"""code_tests' sandbox: completions that fork-bomb, open a network connection, write outside
their folder, print gigabytes or loop forever are contained and scored 0 with the right
detail, and the engine actors running them survive and go on (a real job on Ray)."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.jobs.spec import parse_job_spec
from rollout.runtime.runner import JobRunner
from rollout.scoring.sandbox import Limits, run_program


@pytest.fixture
def listener():
    """A TCP server on loopback counting the connections it gets."""
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.2)
    got: list[int] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                got.append(1)
                conn.close()
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield sock.getsockname()[1], got
    stop.set()
    thread.join()
    sock.close()


def hostile(port: int, outside: Path) -> dict[str, tuple[str, str]]:
    """name -> (program, expected detail)."""
    return {
        "fork bomb": ("import os\nwhile True:\n    os.fork()\n", "error: sandbox refused os.fork"),
        "subprocess": (
            "import subprocess\nsubprocess.run(['sh', '-c', 'echo hi'])\n",
            "error: sandbox refused import",
        ),  # fmt: skip
        "network": (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\n",
            "error: sandbox refused socket.getaddrinfo",
        ),  # fmt: skip
        "raw socket": (
            f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\n",
            "error: sandbox refused socket.__new__",
        ),  # fmt: skip
        "write outside": (
            f"open({str(outside / 'pwned.txt')!r}, 'w').write('x')\n",
            "error: sandbox refused open",
        ),  # fmt: skip
        "remove outside": (
            f"import os\nos.remove({str(outside / 'keep.txt')!r})\n",
            "error: sandbox refused os.remove",
        ),  # fmt: skip
        "print gigabytes": (
            "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
            "error: output over 1 MiB",
        ),  # fmt: skip
        "loop forever": ("while True:\n    pass\n", "timeout: over 1 s"),
        "sleep forever": ("import time\ntime.sleep(3600)\n", "timeout: over 1 s"),
        "memory": ("x = bytearray(8 * 1024 ** 3)\n", "failed: MemoryError"),
        "C library": (
            "import ctypes\nctypes.CDLL(None).system(b'id')\n",
            "error: sandbox refused ctypes.dlopen",
        ),  # fmt: skip
        "early exit": ("import os\nos._exit(0)\n", "failed: exit 0"),
        "sys.exit(0)": ("import sys\nsys.exit(0)\n", "failed: SystemExit(0)"),
        "fails a test": ("assert 1 + 1 == 3\n", "failed: AssertionError"),
        "passes": (
            "import collections, math, hashlib\nassert math.gcd(12, 18) == 6\nopen('scratch.txt', 'w').write('ok')\n",
            "passed",
        ),  # fmt: skip
    }


def test_each_escape_is_contained_with_its_verdict(tmp_path, listener):
    port, connections = listener
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    before = {p.pid for p in psutil.process_iter()}
    limits = Limits(timeout_s=1, memory_mb=512, file_mb=1)
    for name, (program, detail) in hostile(port, outside).items():
        assert run_program(program, limits, str(tmp_path)).detail == detail, name
    assert connections == []  # nothing reached the listener
    assert sorted(os.listdir(outside)) == ["keep.txt"] and (outside / "keep.txt").read_text() == "keep"  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["outside"]  # the sandboxes' folders are gone
    left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before
            and any("sandbox_child" in c for c in (p.info["cmdline"] or []))]  # fmt: skip
    assert left == []  # every program's process group was killed


def test_hostile_completions_in_a_job_score_0_and_the_actors_go_on(ray_runtime, tmp_path, listener):
    port, connections = listener
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    cases = hostile(port, outside)
    names = list(cases)
    pq.write_table(pa.table({"name": names, "q": ["write a program"] * len(names),
                             "completion": [cases[n][0] for n in names]}), tmp_path / "in.parquet")  # fmt: skip
    spec = parse_job_spec({
        "input": {"path": str(tmp_path / "in.parquet")}, "prompt": {"column": "q"},
        "teacher_forcing": {"completion_column": "completion"},
        "engine": {"name": "synthetic"}, "id_column": "name", "shard_size": 4,
        "pool": {"actors": 2, "cpus_per_actor": 0.5}, "output": str(tmp_path / "run"),
        "scoring": [{"name": "tests", "scorer": "code_tests", "program": "{output}",
                     "timeout_s": 1, "memory_mb": 512, "workers": 4}],
    })  # fmt: skip
    summary = JobRunner(spec).run()
    assert summary.rows == len(names) and summary.actor_restarts == 0
    table = pa.concat_tables(pq.read_table(p) for p in sorted((tmp_path / "run" / "data").glob("*.parquet")))  # fmt: skip
    got = dict(zip(table.column("example_id").to_pylist(), zip(table.column("score_tests").to_pylist(), table.column("score_tests_detail").to_pylist(), strict=True), strict=True))  # fmt: skip
    for name in names:
        detail = cases[name][1]
        assert got[name] == (1.0 if detail == "passed" else 0.0, detail), name
    assert connections == [] and sorted(os.listdir(outside)) == ["keep.txt"]
    scores = json.loads((tmp_path / "run" / "scores.json").read_text())
    assert scores["metrics"]["tests"]["mean"] == pytest.approx(1 / len(names))
