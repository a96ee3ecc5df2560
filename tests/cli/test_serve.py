"""`rollout serve` and the client commands, as separate processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollout.cli.main", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)  # fmt: skip


def on_a_terminal(argv: list[str], cwd: Path, env: dict) -> str:
    """Run a command with a pseudo-terminal as its stderr; what it wrote there."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 120 columns
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the command ended and closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace")


def test_serve_submit_wait_status_list_manifest(tmp_path: Path):
    pq.write_table(
        pa.Table.from_pylist([{"q": f"Name a color, take {i}."} for i in range(4)]),
        tmp_path / "in.parquet",
    )
    (tmp_path / "job.yaml").write_text(
        "input: {path: in.parquet}\nprompt: {column: q, chat: true}\nsampling: {max_tokens: 4}\nshard_size: 2\noutput: out\n"
    )
    (tmp_path / "token").write_text("t0ken\n")
    port = free_port()
    env = {
        **os.environ,
        "ROLLOUT_SERVER": f"127.0.0.1:{port}",
        "ROLLOUT_TOKEN_FILE": str(tmp_path / "token"),
    }
    server = subprocess.Popen(
        [sys.executable, "-m", "rollout.cli.main", "serve", "--address", f"127.0.0.1:{port}",
         "--state-dir", str(tmp_path / "state"), "--data-root", str(tmp_path), "--token-file", str(tmp_path / "token")],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while cli("list", cwd=tmp_path, env=env).returncode != 0:
            assert time.monotonic() < deadline and server.poll() is None, (
                "the server did not come up"
            )
            time.sleep(0.5)
        submitted = cli("submit", "job.yaml", "--wait", cwd=tmp_path, env=env)
        assert submitted.returncode == 0, submitted.stderr[-2000:]
        job_id = submitted.stdout.strip()
        assert "SUCCEEDED" in submitted.stderr and "shards 2/2" in submitted.stderr
        # on a terminal, a progress bar like `rollout run`'s instead of a line per change
        watched = on_a_terminal(
            [sys.executable, "-m", "rollout.cli.main", "watch", job_id], tmp_path, env
        )
        assert "100%|" in watched and "shard" in watched and "SUCCEEDED" in watched
        status = json.loads(cli("status", job_id, "--json", cwd=tmp_path, env=env).stdout)
        assert status["state"] == "SUCCEEDED" and status["output"] == str(tmp_path / "out")
        manifest = json.loads(cli("manifest", job_id, cwd=tmp_path, env=env).stdout)
        assert manifest["run_digest"] == status["run_digest"]
        assert job_id in cli("list", "--state", "succeeded", cwd=tmp_path, env=env).stdout
        missing = cli("status", "nope", cwd=tmp_path, env=env)
        assert missing.returncode == 2 and "NOT_FOUND: no job 'nope'" in missing.stderr
        no_token = cli("list", cwd=tmp_path, env={**env, "ROLLOUT_TOKEN_FILE": ""})
        assert no_token.returncode == 2 and "UNAUTHENTICATED" in no_token.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=120) == 0
    assert "listening on 127.0.0.1" in server.stderr.read()
