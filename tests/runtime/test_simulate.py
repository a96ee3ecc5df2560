"""The scheduler-level simulation: the real pool scheduler and store, simulated replicas."""

from __future__ import annotations

from rollout.runtime.manifest import Manifest
from rollout.runtime.simulate import simulate_job


def test_simulated_cluster_records_every_shard_once_with_straggler_backups(tmp_path):
    report = simulate_job(tmp_path / "run", rows=50_000, shard_size=100, replicas=16,
                          slow_factor=8)  # fmt: skip
    manifest = Manifest.load(tmp_path / "run")
    assert manifest is not None and manifest.status == "complete"
    assert len(manifest.shards) == report.shards == 500
    assert all(s.complete and s.rows == 100 for s in manifest.shards)
    assert report.backup_copies >= 1  # the slow replica's shards got backups on idle ones
    assert report.shards_recorded_twice == 0  # ...and no shard was recorded twice
    assert report.journal_appends <= 500
    # the pool measures dispatch in real time, so the simulated clock's jumps do not count
    assert 0 < report.dispatch_p50_ms <= report.dispatch_p99_ms < report.simulated_s * 1000
    # replica 0 runs 8x slower: without backups the job would wait on its last shards
    no_backup = simulate_job(tmp_path / "nb", rows=50_000, shard_size=100, replicas=16,
                             slow_factor=8, backup_after=None)  # fmt: skip
    assert no_backup.backup_copies == 0 and no_backup.simulated_s > report.simulated_s
