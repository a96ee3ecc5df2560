"""Files under the data roots are opened without following symlinks (rollout/data/confined.py):
a path that passed the roots check and is swapped for a symlink before the read or the
write is refused at the open itself, so no window is left between the check and the use."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollout.data import confined
from rollout.data.confined import confined_dir, open_under_roots
from rollout.data.sources import Source
from rollout.errors import AccessError

SECRET = "SECRET-OUTSIDE-2"


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "in").mkdir(parents=True)
    outside.mkdir()
    pq.write_table(pa.table({"q": ["a", "b"]}), root / "in" / "a.parquet")
    pq.write_table(pa.table({"q": ["c", "d"]}), root / "in" / "b.parquet")
    pq.write_table(pa.table({"q": [SECRET, SECRET]}), outside / "b.parquet")
    return root, outside


@pytest.fixture(params=["proc", "no-proc"])
def proc(request, monkeypatch, tmp_path) -> str:
    """Both ways a confined file is read: through /proc/self/fd, and through the descriptor
    itself where the platform has no /proc."""
    if request.param == "no-proc":
        monkeypatch.setattr(confined, "PROC_FD", tmp_path / "no-such-proc")
    return request.param


def test_a_file_swapped_for_a_symlink_after_the_listing_is_refused_at_the_read(tree, proc):
    root, outside = tree
    source = Source(str(root / "in"), roots=[str(root)])
    assert source.row_counts() == [2, 2]
    victim = root / "in" / "b.parquet"
    victim.unlink()
    victim.symlink_to(outside / "b.parquet")  # after the check, before the read
    with pytest.raises(AccessError) as err:
        list(source.read(0, 4, ["q"]))
    assert str(victim) in str(err.value) and "outside the data roots" in str(err.value)
    # rows before the swapped file are read as ever
    assert pa.Table.from_batches(list(source.read(0, 2, ["q"]))).column("q").to_pylist() == ["a", "b"]  # fmt: skip


def test_a_swap_between_the_resolution_and_the_open_is_refused(tree, proc, monkeypatch):
    """The attacker wins the race: the file is swapped after the path was resolved and
    checked, just before the open. The open itself refuses to follow."""
    root, outside = tree
    source = Source(str(root / "in"), roots=[str(root)])
    victim = root / "in" / "b.parquet"
    resolve = os.path.realpath

    def resolve_then_swap(path, *args, **kwargs):
        real = resolve(path, *args, **kwargs)
        if path == str(victim) and not victim.is_symlink():
            victim.unlink()
            victim.symlink_to(outside / "b.parquet")
        return real

    monkeypatch.setattr(confined.os.path, "realpath", resolve_then_swap)
    with pytest.raises(AccessError) as err:
        list(source.read(2, 4, ["q"]))
    assert f"{victim} is a symlink" in str(err.value)
    assert victim.is_symlink()  # the swap did happen; nothing of the secret was read


def test_a_folder_swapped_for_a_symlink_is_refused_at_the_read(tree, proc):
    root, outside = tree
    source = Source(str(root / "in" / "*.parquet"), roots=[str(root)])
    assert source.num_rows == 4
    (root / "in").rename(root / "moved")
    (root / "in").symlink_to(outside)
    with pytest.raises(AccessError) as err:
        list(source.read(0, 4, ["q"]))
    assert "a.parquet" in str(err.value) and "outside the data roots" in str(err.value)


def test_reads_under_the_roots_give_the_same_rows_as_unconfined_ones(tree, proc):
    root, _ = tree
    # a symlink that stays inside the roots is resolved once, then opened without following
    (root / "alias.parquet").symlink_to(root / "in" / "a.parquet")
    for path in (str(root / "in"), str(root / "alias.parquet")):
        free = pa.Table.from_batches(list(Source(path).read(0, 2)))
        held = pa.Table.from_batches(list(Source(path, roots=[str(root)]).read(0, 2)))
        assert held.equals(free)
        assert Source(path, roots=[str(root)]).fingerprint() == Source(path).fingerprint()


def test_a_path_outside_the_roots_is_refused(tree):
    root, outside = tree
    with pytest.raises(AccessError, match="outside the data roots"):
        open_under_roots("input.path", str(outside / "b.parquet"), [str(root)])
    with pytest.raises(AccessError, match="is not a regular file"):
        open_under_roots("input.path", str(root / "in"), [str(root)])


def test_a_pinned_output_folder_keeps_writing_where_it_was_checked(tree):
    root, outside = tree
    with confined_dir("output", str(root / "run" / ".incomplete"), [str(root)]) as folder:
        assert (root / "run" / ".incomplete").is_dir()  # made, one component at a time
        # the run's parent swapped for a symlink to outside while the run holds the folder
        (root / "run").rename(root / "run-moved")
        (root / "run").symlink_to(outside)
        (folder / "part-000000.parquet").write_bytes(b"shard")
    assert (root / "run-moved" / ".incomplete" / "part-000000.parquet").read_bytes() == b"shard"
    assert list(outside.iterdir()) == [outside / "b.parquet"]
    # and a new open through the swapped name is refused, not followed
    with (
        pytest.raises(AccessError, match="outside the data roots"),
        confined_dir("output", str(root / "run" / ".incomplete"), [str(root)]),
    ):
        pass
    assert os.listdir(outside) == ["b.parquet"]
