"""Corrupt input fails with the file, the row group and the column named: exit 2 from
`rollout run`, FAILED with that reason (never an internal error) from the service; a
page that decompresses without error but fails its checksum is caught too."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.api.server import Server
from rollout.client import RolloutClient, state_name


def corrupt(path: Path, row_group: int, column: str, checksum: bool, compression: str) -> None:
    """Write 3 row groups of (q, other), then spoil the middle of one column chunk's pages."""
    q = [f"question number {i} " * 20 for i in range(300)]
    pq.write_table(pa.table({"q": q, "other": list(range(300))}), path, row_group_size=100,
                   compression=compression, write_page_checksum=checksum, use_dictionary=False)  # fmt: skip
    meta = pq.ParquetFile(path).metadata.row_group(row_group)
    index = [meta.column(i).path_in_schema for i in range(meta.num_columns)].index(column)
    chunk = meta.column(index)
    start = chunk.data_page_offset + chunk.total_compressed_size // 2
    data = bytearray(path.read_bytes())
    for i in range(start, start + 16):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def job_file(tmp_path: Path, inp: Path, out: str) -> Path:
    spec = tmp_path / f"{out}.yaml"
    spec.write_text(f"input: {{path: {inp}}}\nprompt: {{column: q}}\nsampling: {{max_tokens: 2}}\n"
                    f"engine: {{name: synthetic}}\nshard_size: 50\npool: {{cpus_per_actor: 0.5}}\noutput: {tmp_path / out}\n")  # fmt: skip
    return spec


def test_a_page_failing_its_checksum_is_caught(tmp_path):
    """Uncompressed data with flipped bytes reads without error: only the page checksum
    tells, and the reader verifies it."""
    from rollout.data.sources import Source
    from rollout.errors import InputError

    inp = tmp_path / "flipped.parquet"
    corrupt(inp, 0, "q", checksum=True, compression="none")
    with pytest.raises(InputError, match=r"row group 0 of 3, column 'q' cannot be read"):
        list(Source(str(inp)).read(0, 300, ["q"]))


@pytest.mark.parametrize(("checksum", "compression"), [(False, "snappy")])
def test_rollout_run_names_the_file_row_group_and_column(tmp_path, checksum, compression):
    inp = tmp_path / "bad.parquet"
    corrupt(inp, 1, "q", checksum, compression)
    out = subprocess.run([sys.executable, "-m", "rollout.cli.main", "run", str(job_file(tmp_path, inp, "o")), "--quiet"],  # fmt: skip
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert f"input file '{inp}': row group 1 of 3, column 'q' cannot be read" in out.stderr
    assert not (tmp_path / "o" / "data").exists()


def test_the_service_fails_the_job_with_the_reason(ray_runtime, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    inp = root / "bad.parquet"
    corrupt(inp, 2, "q", False, "snappy")
    server = Server("127.0.0.1:0", tmp_path / "state", [root])
    server.start()
    try:
        with RolloutClient(f"127.0.0.1:{server.port}", timeout=30) as client:
            job = client.submit({"input": {"path": str(inp)}, "prompt": {"column": "q"}, "sampling": {"max_tokens": 2},
                                 "engine": {"name": "synthetic"}, "shard_size": 50, "pool": {"cpus_per_actor": 0.5},
                                 "output": str(root / "out")})  # fmt: skip
            deadline = time.monotonic() + 120
            while state_name(job) not in ("SUCCEEDED", "FAILED") and time.monotonic() < deadline:
                time.sleep(0.2)
                job = client.get(job.job_id)
            assert state_name(job) == "FAILED"
            assert "internal error" not in job.error
            assert f"input file '{inp}': row group 2 of 3, column 'q' cannot be read" in job.error
            assert client.health() == "SERVING"
    finally:
        server.stop()
