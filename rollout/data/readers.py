"""One reader class per input format, behind one interface (the way datatrove's readers
are built): Parquet, Arrow IPC (and Hugging Face `save_to_disk` folders), JSONL, CSV, and
OpenAI Batch request files. `Source` (sources.py) finds the files; a reader reads one.

Every failure to read names the file, and for Parquet the row group and the column:
pages are read with checksum verification where the file carries checksums (ours do), so
a page that decompresses into the wrong bytes is an error too, not silent corruption.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.ipc as ipc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from rollout.errors import InputError

Opener = Callable[..., AbstractContextManager[pa.NativeFile]]  # (path, stream=False)
BATCH_ROWS = 4096


def _select(batch: pa.RecordBatch, columns: list[str] | None) -> pa.RecordBatch:
    return batch if columns is None else batch.select(columns)


class Reader:
    """Reads files of one format. Subclasses override `batches` (and, where the format can
    do better than reading everything, `num_rows`, `schema` and `read_range`)."""

    format: ClassVar[str] = ""
    extensions: ClassVar[tuple[str, ...]] = ()

    def __init__(self, open_file: Opener) -> None:
        self.open = open_file

    def batches(self, path: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def checked_batches(self, path: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:  # fmt: skip
        """`batches`, with every failure an InputError naming the file."""
        try:
            yield from self.batches(path, columns)
        except UnicodeDecodeError as exc:
            raise InputError(f"input file {path!r}", f"is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} cannot be decoded ({exc.reason})") from None  # fmt: skip
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, ValueError) as exc:
            raise InputError(f"input file {path!r}", f"cannot be read as {self.format}: {exc}") from None  # fmt: skip

    def num_rows(self, path: str) -> int:
        return sum(b.num_rows for b in self.checked_batches(path, columns=[]))

    def schema(self, path: str) -> pa.Schema:
        for batch in self.checked_batches(path):
            return batch.schema
        raise InputError(f"input file {path!r}", "holds no record batch")

    def read_range(self, path: str, lo: int, hi: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:  # fmt: skip
        """Rows [lo, hi) of the file."""
        pos = 0
        for batch in self.checked_batches(path, columns):
            n = batch.num_rows
            if pos + n > lo and pos < hi:
                yield batch.slice(max(lo - pos, 0), min(hi, pos + n) - max(lo, pos))
            pos += n
            if pos >= hi:
                return


class ParquetReader(Reader):
    format, extensions = "parquet", (".parquet", ".pq")

    def _file(self, handle: pa.NativeFile) -> pq.ParquetFile:
        return pq.ParquetFile(handle, page_checksum_verification=True)

    def _meta(self, path: str, what: Callable[[pq.ParquetFile], Any]) -> Any:
        with self.open(path) as handle:
            return what(self._meta_file(handle, path))

    def num_rows(self, path: str) -> int:
        return self._meta(path, lambda f: f.metadata.num_rows)

    def schema(self, path: str) -> pa.Schema:
        return self._meta(path, lambda f: f.schema_arrow)

    def batches(self, path: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        with self.open(path) as handle:
            pf = self._meta_file(handle, path)
            for g in range(pf.metadata.num_row_groups):
                yield from self._row_group(pf, path, g, columns).to_batches(BATCH_ROWS)

    def read_range(self, path: str, lo: int, hi: int, columns: list[str] | None) -> Iterator[pa.RecordBatch]:  # fmt: skip
        """Only the row groups holding rows [lo, hi) are read."""
        with self.open(path) as handle:
            pf = self._meta_file(handle, path)
            pos = 0
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if pos + n > lo and pos < hi:
                    table = self._row_group(pf, path, g, columns)
                    yield from table.slice(
                        max(lo - pos, 0), min(hi, pos + n) - max(lo, pos)
                    ).to_batches()
                pos += n
                if pos >= hi:
                    return

    def _meta_file(self, handle: pa.NativeFile, path: str) -> pq.ParquetFile:
        try:
            return self._file(handle)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"input file {path!r}", f"is not a readable Parquet file: {exc}") from None  # fmt: skip

    def _row_group(self, pf: pq.ParquetFile, path: str, g: int, columns: list[str] | None) -> pa.Table:  # fmt: skip
        try:
            return pf.read_row_group(g, columns=columns)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
            # find the column at fault, one at a time (only on this error path)
            names = columns if columns is not None else pf.schema_arrow.names
            bad = None
            for name in names:
                try:
                    pf.read_row_group(g, columns=[name])
                except (pa.ArrowInvalid, pa.ArrowTypeError, OSError):
                    bad = name
                    break
            where = f"row group {g} of {pf.metadata.num_row_groups}" + (f", column {bad!r}" if bad else "")  # fmt: skip
            raise InputError(f"input file {path!r}", f"{where} cannot be read (corrupt or truncated data): {exc}") from None  # fmt: skip


class ArrowReader(Reader):
    """Arrow IPC, in the file format or as a stream (what `datasets` saves)."""

    format, extensions = "arrow", (".arrow", ".feather", ".ipc")

    def batches(self, path: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        with self.open(path) as handle:
            magic = handle.read(6)
            handle.seek(0)
            if magic == b"ARROW1":
                reader = ipc.open_file(handle)
                for i in range(reader.num_record_batches):
                    yield _select(reader.get_batch(i), columns)
            else:
                for batch in ipc.open_stream(handle):
                    yield _select(batch, columns)


class HFReader(ArrowReader):
    """The Arrow files of a Hugging Face dataset saved with `save_to_disk`."""

    format, extensions = "hf", ()


class JsonlReader(Reader):
    format, extensions = "jsonl", (".jsonl", ".ndjson", ".json")

    def batches(self, path: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        with self.open(path, stream=True) as handle:
            for batch in pajson.open_json(handle):
                yield _select(batch, columns)


class CsvReader(Reader):
    format, extensions = "csv", (".csv",)

    def batches(self, path: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        with self.open(path, stream=True) as handle:
            for batch in pacsv.open_csv(handle):
                yield _select(batch, columns)


class OpenAIBatchReader(Reader):
    """OpenAI Batch API request files (rollout/data/openai_batch.py): one request per line,
    as columns (custom_id, messages or prompt, the request's own sampling parameters)."""

    format, extensions = "openai-batch", ()

    def batches(self, path: str, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        from rollout.data.openai_batch import SCHEMA, request_row

        rows: list[dict[str, Any]] = []
        with self.open(path, stream=True) as handle:
            lines = handle.read().decode("utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(request_row(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise InputError(f"input file {path!r} line {number}", f"is not JSON: {exc}") from None  # fmt: skip
            except InputError as exc:
                raise InputError(f"input file {path!r} line {number}: {exc.where}", exc.reason) from None  # fmt: skip
            if len(rows) == BATCH_ROWS:
                yield _select(pa.RecordBatch.from_pylist(rows, schema=SCHEMA), columns)
                rows = []
        if rows or not lines:
            yield _select(pa.RecordBatch.from_pylist(rows, schema=SCHEMA), columns)


READERS: dict[str, type[Reader]] = {
    r.format: r
    for r in (
        ParquetReader,
        ArrowReader,
        HFReader,
        JsonlReader,
        CsvReader,
        OpenAIBatchReader,
    )  # fmt: skip
}
EXTENSIONS: dict[str, str] = {ext: r.format for r in READERS.values() for ext in r.extensions}
