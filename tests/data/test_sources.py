"""Input sources on real files of every supported format."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from rollout.data.sources import Source
from rollout.errors import InputError

ROWS = [{"q": f"question {i}", "k": i} for i in range(25)]


def table(rows=ROWS) -> pa.Table:
    return pa.Table.from_pylist(rows)


def read_all(src: Source, start: int = 0, end: int | None = None) -> list[dict]:
    end = src.num_rows if end is None else end
    return pa.Table.from_batches(list(src.read(start, end))).to_pylist()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    pq.write_table(table(), tmp_path / "d.parquet", row_group_size=4)
    out["parquet"] = tmp_path / "d.parquet"
    feather.write_feather(table(), tmp_path / "d.feather")
    out["arrow"] = tmp_path / "d.feather"
    with (
        pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, table().schema) as w,
    ):
        for b in table().to_batches(max_chunksize=6):
            w.write_batch(b)
    out["arrow-stream"] = tmp_path / "s.arrow"
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out["jsonl"] = tmp_path / "d.jsonl"
    pacsv.write_csv(table(), tmp_path / "d.csv")
    out["csv"] = tmp_path / "d.csv"
    return out


@pytest.mark.parametrize("kind", ["parquet", "arrow", "arrow-stream", "jsonl", "csv"])
def test_every_format_reads_all_rows_and_any_range(files, kind):
    src = Source(str(files[kind]))
    assert src.num_rows == 25
    assert read_all(src) == ROWS
    assert read_all(src, 3, 17) == ROWS[3:17]
    assert read_all(src, 24, 25) == ROWS[24:]


def test_hf_save_to_disk_dataset_and_datasetdict(tmp_path: Path):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "one"))
    assert read_all(Source(str(tmp_path / "one"))) == ROWS
    dd = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_list(ROWS[:5])})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert read_all(Source(str(tmp_path / "dict"), split="test")) == ROWS[:5]
    with pytest.raises(
        InputError, match=r"is a DatasetDict with splits \['train', 'test'\]; set input.split"
    ):
        Source(str(tmp_path / "dict"))
    with pytest.raises(InputError, match="has no split 'valid'"):
        Source(str(tmp_path / "dict"), split="valid")


def test_directory_and_glob_are_read_in_lexicographic_order(tmp_path: Path):
    (tmp_path / "in").mkdir()
    for name, part in [
        ("b.parquet", ROWS[10:]),
        ("a.parquet", ROWS[:10]),
        ("_SUCCESS.parquet", ROWS[:1]),
    ]:
        pq.write_table(table(part), tmp_path / "in" / name)
    assert read_all(Source(str(tmp_path / "in"))) == ROWS
    assert (
        read_all(Source(str(tmp_path / "in" / "*.parquet"))) == ROWS[:1] + ROWS
    )  # a glob takes what it matches
    assert read_all(Source(str(tmp_path / "in" / "[ab].parquet"))) == ROWS
    assert read_all(Source(f"file://{tmp_path}/in"), 8, 12) == ROWS[8:12]


def test_bad_inputs_name_the_file(tmp_path: Path):
    with pytest.raises(InputError, match="no such file or directory"):
        Source(str(tmp_path / "missing.parquet"))
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputError, match=r"bad.parquet.*is not a readable Parquet file"):
        Source(str(tmp_path / "bad.parquet")).row_counts()
    (tmp_path / "mixed").mkdir()
    pq.write_table(table(ROWS[:5]), tmp_path / "mixed" / "a.parquet")
    pq.write_table(pa.Table.from_pylist([{"q": 1, "k": 2}]), tmp_path / "mixed" / "b.parquet")
    with pytest.raises(
        InputError, match=r"b.parquet.*schema differs.*column 'q' is int64, not string"
    ):
        Source(str(tmp_path / "mixed")).schema()
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no input file"):
        Source(str(tmp_path / "empty"))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(InputError, match="cannot tell the format"):
        Source(str(tmp_path / "x.txt"))
