"""Fault injection on real processes: each case ends with the digest of an undisturbed run
and every (row_index, sample_index) exactly once (rollout/runtime/faults.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.errors import OutputError
from rollout.jobs.spec import parse_job_spec
from rollout.runtime import faults
from rollout.runtime.manifest import Manifest
from rollout.runtime.runner import JobRunner
from tests.runtime.conftest import independent_run_digest

ROWS, SHARD = 60, 10


@pytest.fixture(scope="module")
def inp(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("in") / "in.parquet"
    pq.write_table(pa.table({"q": [f"Question {i}?" for i in range(ROWS)]}), path)
    return path


def job(inp: Path, out: Path) -> dict:
    return {
        "input": {"path": str(inp)},
        "prompt": {"column": "q"},
        "n": 2,
        "job_seed": 17,
        "sampling": {"temperature": 0.9, "max_tokens": 12, "logprobs": True},
        "engine": {"name": "synthetic", "options": {"mean_output_len": 8}},
        "pool": {"actors": 2, "cpus_per_actor": 0.5},
        "shard_size": SHARD,
        "output": str(out),
    }


@pytest.fixture(scope="module")
def clean_digest(ray_runtime, inp, tmp_path_factory) -> str:
    return (
        JobRunner(parse_job_spec(job(inp, tmp_path_factory.mktemp("clean") / "run")))
        .run()
        .run_digest
    )


def exactly_once(run: Path, digest: str) -> None:
    got, rows = independent_run_digest(run)
    keys = [(r["row_index"], r["sample_index"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * ROWS
    assert got == digest


@pytest.mark.parametrize(
    "point", ["before_first_row", "mid_generation", "during_write", "after_write", "after_record"]
)
def test_actor_killed_at_each_point_of_a_shard(
    ray_runtime, inp, clean_digest, tmp_path, monkeypatch, point
):
    marker = tmp_path / "fired"
    monkeypatch.setenv(faults.ENV, f"{point}:2:{marker}")
    summary = JobRunner(parse_job_spec(job(inp, tmp_path / "run"))).run()
    assert marker.exists(), "the fault did not fire"
    assert summary.actor_restarts == 1
    assert summary.run_digest == clean_digest
    exactly_once(tmp_path / "run", clean_digest)
    assert not list((tmp_path / "run" / "data").glob(".*"))  # no temporary file left behind


def test_disk_full_fails_clearly_records_nothing_and_resume_completes(
    ray_runtime, inp, clean_digest, tmp_path, monkeypatch
):
    marker = tmp_path / "fired"
    monkeypatch.setenv(faults.ENV, f"write_enospc:3:{marker}")
    spec = parse_job_spec(job(inp, tmp_path / "run"))
    with pytest.raises(
        OutputError, match=r"shard 3 could not be written: .*No space left on device"
    ):
        JobRunner(spec).run()
    manifest = Manifest.load(tmp_path / "run")  # what the failed run recorded
    recorded = [entry.shard_id for entry in manifest.shards if entry.complete]
    assert 3 not in recorded and not (tmp_path / "run" / "data").exists()
    monkeypatch.delenv(faults.ENV)  # space freed: resume
    summary = JobRunner(spec).run()
    assert summary.run_digest == clean_digest and summary.shards_resumed == len(recorded)
    exactly_once(tmp_path / "run", clean_digest)


def test_corrupted_complete_shard_is_regenerated_on_resume(
    ray_runtime, inp, clean_digest, tmp_path
):
    spec = parse_job_spec(job(inp, tmp_path / "run"))
    JobRunner(spec).run()
    victim = tmp_path / "run" / "data" / "part-000002.parquet"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the file
    victim.write_bytes(bytes(data))
    summary = JobRunner(spec).run()
    assert summary.shards_resumed == ROWS // SHARD - 1  # all but the corrupted one kept
    exactly_once(tmp_path / "run", clean_digest)


SERVE = [sys.executable, "-m", "rollout.cli.main", "serve"]


def start_service(root: Path, state: Path, env: dict[str, str] | None = None,
                  args: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """A `rollout serve` process on a free loopback port, once it answers SERVING."""
    from rollout.client import wait_until_serving
    from tests.cli.test_serve import free_port

    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen(SERVE + ["--address", address, "--state-dir", str(state),
                                     "--data-root", str(root), *args],
                            env={**os.environ, **(env or {})}, start_new_session=True)  # fmt: skip
    if not wait_until_serving(address, alive=lambda: proc.poll() is None):
        proc.kill()
        raise AssertionError("the service did not start")
    return proc, address


KILL_POINTS = ("before_first_row", "mid_generation", "during_write", "after_write", "after_record")


def test_service_killed_at_each_point_of_a_shard_and_restarted(inp, clean_digest, tmp_path):
    """One job; the service is SIGKILLed five times, once at each point of a shard (shards
    1..5), and restarted each time: the job resumes from its run directory and ends with
    the undisturbed digest, every row exactly once, no temporary file left."""
    import grpc

    from rollout.client import RolloutClient, state_name

    root = inp.parent
    state = tmp_path / "state"
    spec = job(inp, root / "svc-run")
    spec["pool"]["actors"] = 1  # one shard at a time: one kill per service life
    plan = ";".join(f"{p}:{i + 1}:{tmp_path / p}" for i, p in enumerate(KILL_POINTS))
    env = {faults.ENV: plan, faults.KILL_ENV: "service"}
    job_id, last, kills = None, None, 0
    while last is None and kills <= len(KILL_POINTS):
        proc, address = start_service(root, state, env)
        try:
            with RolloutClient(address) as client:
                job_id = job_id or client.submit(spec).job_id
                last = list(client.watch(job_id))[-1]
                assert client.health() == "SERVING"
        except grpc.RpcError:  # the service died under the watch
            assert proc.wait(30) == -signal.SIGKILL
            kills += 1
            # what a supervisor does (systemd's KillMode=control-group): Ray's agents
            # outlive a SIGKILLed driver, so take its whole process group down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(60)
    assert faults.fired(plan) == list(KILL_POINTS) and kills == len(KILL_POINTS)
    assert last is not None and state_name(last) == "SUCCEEDED", last
    assert last.run_digest == clean_digest
    exactly_once(root / "svc-run", clean_digest)
    assert not list((root / "svc-run" / "data").glob(".*"))


@pytest.fixture
def small_fs(tmp_path):
    """A real 1 MiB tmpfs (needs root or CAP_SYS_ADMIN; elsewhere the injected ENOSPC test
    above still covers the writer)."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "rollout-test", str(mount)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def remount(mount: Path, mode: str) -> None:
    """Remount `mount` ro or rw; a remount to ro waits out a file open for writing (EBUSY)."""
    for _ in range(200):
        if subprocess.run(["mount", "-o", f"remount,{mode}", str(mount)], capture_output=True,
                          check=False).returncode == 0:  # fmt: skip
            return
        time.sleep(0.05)
    raise AssertionError(f"could not remount {mount} {mode}")


def recorded_shards_verify(run: Path) -> list[int]:
    """The shards the failed run recorded; each one's file is whole and matches its digest."""
    from rollout.audit.runs import verify_shard_file

    manifest = Manifest.load(run)
    assert manifest is not None and not (run / "data").exists()
    done = [e for e in manifest.shards if e.complete]
    for entry in done:
        assert verify_shard_file(run / ".incomplete" / entry.file, manifest.determinism) == (
            entry.shard_digest,
            entry.rows,
        )
    return [e.shard_id for e in done]


def test_output_filesystem_full_then_read_only(inp, clean_digest, small_fs, tmp_path):
    """On a real tmpfs, through the service: a full disk, then a read-only remount mid-job.
    Each job fails with the reason, records only shards it wrote whole, and the service
    keeps serving; once space is freed (or the filesystem writable again), resubmitting
    the spec resumes the run to the undisturbed digest."""
    from rollout.client import RolloutClient, state_name

    filler = small_fs / "filler"
    free = os.statvfs(small_fs).f_bavail * os.statvfs(small_fs).f_frsize
    filler.write_bytes(b"\0" * (free - 40 * 1024))  # room for the manifest and two shards
    proc, address = start_service(inp.parent, tmp_path / "state",
                                  args=("--data-root", str(inp.parent), "--data-root", str(small_fs)))  # fmt: skip
    try:
        with RolloutClient(address) as client:
            full = job(inp, small_fs / "full-run")
            last = list(client.watch(client.submit(full).job_id))[-1]
            assert state_name(last) == "FAILED" and "No space left on device" in last.error
            assert str(small_fs / "full-run") in last.error
            assert len(recorded_shards_verify(small_fs / "full-run")) < ROWS // SHARD
            filler.unlink()  # space freed
            last = list(client.watch(client.submit(full).job_id))[-1]
            assert state_name(last) == "SUCCEEDED" and last.run_digest == clean_digest
            exactly_once(small_fs / "full-run", clean_digest)

            ro = job(inp, small_fs / "ro-run")
            ro["engine"]["options"]["tokens_per_s"] = 100  # slow enough to change the fs mid-job
            job_id = client.submit(ro).job_id
            for update in client.watch(job_id):
                if update.progress.shards_done >= 2:
                    break
            remount(small_fs, "ro")
            last = list(client.watch(job_id))[-1]
            assert state_name(last) == "FAILED" and "Read-only file system" in last.error
            assert 2 <= len(recorded_shards_verify(small_fs / "ro-run")) < ROWS // SHARD
            remount(small_fs, "rw")
            last = list(client.watch(client.submit(ro).job_id))[-1]
            assert state_name(last) == "SUCCEEDED" and last.run_digest == clean_digest
            exactly_once(small_fs / "ro-run", clean_digest)
            assert client.health() == "SERVING"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def ray_head(port: int) -> subprocess.Popen:
    """A Ray cluster of its own (a head node in its own session, so that killing the
    session takes the GCS, the raylet and every worker, and nothing of the tests' Ray)."""
    ray = Path(sys.executable).with_name("ray")
    return subprocess.Popen([str(ray), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
                             "--include-dashboard=false", "--disable-usage-stats"],
                            start_new_session=True, stdout=subprocess.DEVNULL, env=os.environ | RAY_AUTH,
                            stderr=subprocess.DEVNULL)  # fmt: skip


# The separate cluster runs with Ray's token authentication, as docs/security.md asks, and
# the service that joins it is given the token.
RAY_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "f" * 64}


def test_ray_runtime_lost_mid_job_fails_cleanly_and_resumes(inp, clean_digest, tmp_path):
    """The service joins a separate Ray cluster; the whole cluster is killed mid-job. The
    job fails with the reason (not an internal error, not a hang), the service keeps
    serving, and once the cluster is back, resubmitting the spec resumes to the digest."""
    from rollout.client import RolloutClient, state_name
    from tests.cli.test_serve import free_port

    port = free_port()
    head = ray_head(port)
    proc = None
    try:
        proc, address = start_service(inp.parent, tmp_path / "state", env=RAY_AUTH,
                                      args=("--ray-address", f"127.0.0.1:{port}"))  # fmt: skip
        spec = job(inp, inp.parent / "lost-run")
        spec["engine"]["options"]["tokens_per_s"] = 100  # slow enough to lose Ray mid-job
        with RolloutClient(address) as client:
            job_id = client.submit(spec).job_id
            for update in client.watch(job_id):
                if update.progress.shards_done >= 2:
                    break
            os.killpg(head.pid, signal.SIGKILL)  # the cluster is gone
            head.wait(30)
            last = list(client.watch(job_id))[-1]
            assert state_name(last) == "FAILED", last
            assert "the Ray runtime at" in last.error and "was lost mid-job" in last.error
            assert "internal error" not in last.error
            assert client.health() == "SERVING"
            assert 2 <= len(recorded_shards_verify(inp.parent / "lost-run")) < ROWS // SHARD
            head = ray_head(port)  # Ray is back
            last = list(client.watch(client.submit(spec).job_id))[-1]
            assert state_name(last) == "SUCCEEDED", last.error
            assert last.run_digest == clean_digest
        exactly_once(inp.parent / "lost-run", clean_digest)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)


def test_fault_points_are_documented():
    doc = faults.__doc__ or ""
    assert all(p in doc for p in faults.POINTS)
