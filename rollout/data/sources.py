"""Input datasets as one ordered sequence of rows, read in row ranges without loading it all.

Files are taken in lexicographic order of their paths (DETERMINISM.md: `row_index` is
the position in that concatenation), or in a Hugging Face dataset's stored order.
Every read streams record batches: Parquet skips to the row groups it needs, the other
formats stream from the start of a file.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.fs as pafs

from rollout.data.confined import fd_path, open_under_roots
from rollout.data.readers import EXTENSIONS, READERS, Reader
from rollout.errors import InputError

_GLOB_CHARS = set("*?[")


@dataclass(frozen=True)
class InputFile:
    path: str  # path within the filesystem
    size: int


def _filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" in path:
        try:
            return pafs.FileSystem.from_uri(path)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
            raise InputError(f"input.path {path!r}", f"cannot open this URI: {exc}") from None
    return pafs.LocalFileSystem(), os.path.abspath(path)


def _kind(fs: pafs.FileSystem, path: str) -> pafs.FileType:
    return fs.get_file_info(path).type


def _format_of(name: str) -> str | None:
    return EXTENSIONS.get(PurePosixPath(name).suffix.lower())


def _is_hf_folder(fs: pafs.FileSystem, path: str) -> bool:
    infos = {i.base_name for i in fs.get_file_info(pafs.FileSelector(path))}
    return "state.json" in infos or "dataset_dict.json" in infos


def _read_json(fs: pafs.FileSystem, path: str) -> dict:
    with fs.open_input_stream(path) as f:
        return json.loads(f.read().decode("utf-8"))


class Source:
    """An input dataset: its files, format, schema and row counts."""

    def __init__(
        self, path: str, fmt: str = "auto", split: str | None = None, roots: Sequence[str] = ()
    ) -> None:
        self.spec_path = path
        # with roots (the service's data roots), every file is opened under them without
        # following symlinks (rollout/data/confined.py)
        self.roots = tuple(roots)
        self.fs, root = _filesystem(path)
        self.format, self.files = self._discover(root, fmt, split)
        self._counts: list[int] | None = None

    # -- discovery ----------------------------------------------------------------------------
    def _discover(self, root: str, fmt: str, split: str | None) -> tuple[str, list[InputFile]]:
        where = f"input.path {self.spec_path!r}"
        if _GLOB_CHARS & set(root):
            base = root
            while _GLOB_CHARS & set(base):
                base = str(PurePosixPath(base).parent)
            infos = self.fs.get_file_info(
                pafs.FileSelector(base, recursive=True, allow_not_found=True)
            )
            files = [
                i for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, root)
            ]
            if not files:
                raise InputError(where, "the glob matches no file")
            return self._typed(files, fmt, where)
        kind = _kind(self.fs, root)
        if kind == pafs.FileType.NotFound:
            raise InputError(where, "no such file or directory")
        if kind == pafs.FileType.File:
            info = self.fs.get_file_info(root)
            return self._typed([info], fmt, where)
        if fmt == "hf" or (fmt == "auto" and _is_hf_folder(self.fs, root)):
            return "hf", self._hf_files(root, split, where)
        infos = self.fs.get_file_info(pafs.FileSelector(root, recursive=True))
        files = [
            i
            for i in infos
            if i.type == pafs.FileType.File
            and not any(
                p.startswith((".", "_")) for p in PurePosixPath(i.path).relative_to(root).parts
            )
            and (_format_of(i.path) is not None)
        ]
        if not files:
            raise InputError(
                where, f"the directory holds no input file ({', '.join(sorted(EXTENSIONS))})"
            )
        return self._typed(files, fmt, where)

    def _typed(self, infos: list, fmt: str, where: str) -> tuple[str, list[InputFile]]:
        infos = sorted(infos, key=lambda i: i.path)
        formats = {fmt} if fmt != "auto" else {_format_of(i.path) for i in infos}
        if None in formats:
            bad = next(i.path for i in infos if _format_of(i.path) is None)
            raise InputError(where, f"cannot tell the format of {bad!r}; set input.format")
        if len(formats) > 1:
            raise InputError(where, f"mixes formats {sorted(formats)}; point it at one format")
        return formats.pop(), [InputFile(i.path, i.size) for i in infos]

    def _hf_files(self, root: str, split: str | None, where: str) -> list[InputFile]:
        names = {i.base_name for i in self.fs.get_file_info(pafs.FileSelector(root))}
        if "dataset_dict.json" in names:
            splits = _read_json(self.fs, f"{root}/dataset_dict.json").get("splits", [])
            if split is None:
                if len(splits) != 1:
                    raise InputError(
                        where, f"is a DatasetDict with splits {splits}; set input.split"
                    )
                split = splits[0]
            if split not in splits:
                raise InputError(where, f"has no split {split!r}; its splits are {splits}")
            root = f"{root}/{split}"
        elif split is not None:
            raise InputError(where, f"is a single Dataset; input.split {split!r} does not apply")
        state = _read_json(self.fs, f"{root}/state.json")
        files = [f"{root}/{d['filename']}" for d in state.get("_data_files", [])]
        if not files:
            raise InputError(where, "state.json lists no data files")
        return [InputFile(p, self.fs.get_file_info(p).size) for p in files]

    # -- reading ------------------------------------------------------------------------------
    @contextmanager
    def _open(self, path: str, stream: bool = False) -> Iterator[pa.NativeFile]:
        opener = self.fs.open_input_stream if stream else self.fs.open_input_file
        if not self.roots:
            with opener(path) as handle:
                yield handle
            return
        fd = open_under_roots("input.path", path, self.roots)
        try:
            pinned = fd_path(fd)
            if pinned is None:  # no /proc: read through the descriptor itself
                with pa.PythonFile(os.fdopen(os.dup(fd), "rb"), mode="r") as handle:
                    yield handle
                return
            handle = opener(pinned)
        finally:
            os.close(fd)
        with handle:
            yield handle

    @property
    def reader(self) -> Reader:
        return READERS[self.format](self._open)

    def row_counts(self) -> list[int]:
        """Rows per file (cached); parsing each file once checks it can be read."""
        if self._counts is None:
            self._counts = [self.reader.num_rows(f.path) for f in self.files]
        return self._counts

    @property
    def num_rows(self) -> int:
        return sum(self.row_counts())

    def schema(self) -> pa.Schema:
        """The schema all files share; a file whose schema differs is an input error."""
        first: pa.Schema | None = None
        for f in self.files:
            schema = self.reader.schema(f.path)
            if first is None:
                first = schema
            elif not schema.equals(first):
                diff = _schema_diff(first, schema)
                raise InputError(
                    f"input file {f.path!r}",
                    f"its schema differs from {self.files[0].path!r}: {diff}",
                )
        assert first is not None
        return first

    def read(
        self, start: int, end: int, columns: list[str] | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Rows [start, end) of the whole input, as record batches, in order."""
        offset = 0
        for f, count in zip(self.files, self.row_counts(), strict=True):
            if offset >= end:
                return
            if offset + count <= start:
                offset += count
                continue
            lo, hi = max(start - offset, 0), min(end - offset, count)
            yield from self.reader.read_range(f.path, lo, hi, columns)
            offset += count

    def fingerprint(self) -> dict:
        """Content hashes and row counts of the input, in order (no paths: they do not decide output)."""
        files = []
        for f, rows in zip(self.files, self.row_counts(), strict=True):
            h = hashlib.sha256()
            with self._open(f.path, stream=True) as handle:
                while chunk := handle.read(1 << 22):
                    h.update(chunk)
            files.append({"sha256": h.hexdigest(), "rows": rows})
        return {"format": self.format, "files": files, "rows": sum(x["rows"] for x in files)}


def _schema_diff(a: pa.Schema, b: pa.Schema) -> str:
    names_a, names_b = set(a.names), set(b.names)
    if names_a != names_b:
        parts = []
        if names_b - names_a:
            parts.append(f"extra columns {sorted(names_b - names_a)}")
        if names_a - names_b:
            parts.append(f"missing columns {sorted(names_a - names_b)}")
        return ", ".join(parts)
    for name in a.names:
        if a.field(name).type != b.field(name).type:
            return f"column {name!r} is {b.field(name).type}, not {a.field(name).type}"
    return "column order or metadata differ"
