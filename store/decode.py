"""One table file of an import, decoded within its caps: rows and bytes counted while reading.

A Parquet file is small on disk and large in memory: a 325 KB file of 10M constant rows decoded
to 1.35 GB, a 2 MB zip held a 2 GB tokens table. So a file is never read whole, and a table is
never materialised: its footer's row count must match the manifest and fit the caps, its
declared decoded size must fit, and then it is read from disk in batches of 65,536 rows (strings
kept dictionary-encoded until the batch is cast) whose rows and dense size (what the table takes
once decoded) are counted as they come; the read stops at the first cap crossed. The importer
checks and writes each batch before the next is read. Text must be valid UTF-8.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa

from sketchwalk.store import limits
from sketchwalk.store.bulk import arrow_schema
from sketchwalk.store.errors import ForeignExportError

MIB = 1 << 20
BATCH_ROWS = 1 << 16


@dataclass(frozen=True)
class TableCaps:
    """What one table file may decode to: rows (from the manifest, already capped) and bytes."""

    rows: int
    decoded_bytes: int


def decode_chunks(where: str, path: Path, table: sa.Table, caps: TableCaps) -> Iterator[pa.Table]:
    """The file at `path` as the store's `table`, one batch at a time (exactly its columns,
    cast to their types), counting rows and decoded bytes against `caps` as batches come: a
    batch is yielded only once it fits, so memory holds one batch, never the table."""
    expected = arrow_schema(table)
    # the runs table holds one row a run: a dictionary of its long texts would be one copy more
    strings = [f.name for f in expected if f.type == pa.string() and table.name != "runs"]
    try:
        names = pq.ParquetFile(path).schema_arrow.names  # the footer only
        if sorted(names) != sorted(expected.names):
            raise ForeignExportError(
                f"{where} does not have the columns of sketchwalk's {table.name} table; "
                "not a sketchwalk export"
            )
        # pre_buffer off: with it, the reader fetches every row group ahead (the whole file)
        parquet = pq.ParquetFile(path, read_dictionary=strings, pre_buffer=False)
        meta = parquet.metadata
    except (pa.ArrowException, OSError, KeyError, ValueError) as exc:
        if isinstance(exc, ForeignExportError):
            raise
        raise ForeignExportError(f"{where} is not a readable Parquet file: {_line(exc)}") from None
    if meta.num_rows != caps.rows:
        raise ForeignExportError(
            f"{where} holds {meta.num_rows} rows, its manifest says {caps.rows}; nothing was "
            "imported"
        )
    declared = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    _check_size(where, declared, caps)
    if table.name == "runs":  # one value may be large; elsewhere rows are short and many
        for name, most in limits.RUN_LONGEST.items():
            _check_longest(where, path, meta, name, most)
    rows = size = 0
    batches = parquet.iter_batches(batch_size=BATCH_ROWS, columns=expected.names)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            raise ForeignExportError(
                f"{where} is not a readable Parquet file: {_line(exc)}"
            ) from None
        if batch is None:
            return
        rows += batch.num_rows
        if rows > caps.rows:
            raise ForeignExportError(
                f"{where} holds more rows than its footer and manifest say ({caps.rows}); "
                "nothing was imported"
            )
        size += sum(_dense_bytes(where, name, batch.column(name)) for name in expected.names)
        _check_size(where, size, caps)
        try:
            chunk = pa.Table.from_batches([batch]).select(expected.names).cast(expected)
        except (pa.ArrowException, ValueError) as exc:
            raise ForeignExportError(f"{where}: column types do not match: {_line(exc)}") from None
        del batch
        yield chunk


def _check_longest(where: str, path: Path, meta: pq.FileMetaData, name: str, most: int) -> None:
    """Refuse a value of column `name` longer than `most` characters before a row is decoded
    whole: a row group whose column chunk holds at most `most` bytes cannot hold one (a
    character takes one byte or more); any other is read one value at a time, that column
    alone. A column that is no text is left to the cast to report."""
    fields = meta.schema.to_arrow_schema()
    at = fields.get_field_index(name)
    if at < 0 or not pa.types.is_string(fields.field(at).type):
        return
    for group in range(meta.num_row_groups):
        if meta.row_group(group).column(at).total_uncompressed_size <= most:
            continue
        for row, longest in enumerate(_lengths(where, path, group, name)):
            if longest > most:
                raise ForeignExportError(
                    f"{where}: column {name!r} (row {row} of row group {group}) is longer than "
                    f"{most} characters, the store's limit (store/limits.py); nothing was "
                    "imported"
                )


def _lengths(where: str, path: Path, group: int, name: str) -> Iterator[int]:
    """Characters of each value of one column of one row group, one value in memory at a time."""
    try:
        values = pq.ParquetFile(path, pre_buffer=False).iter_batches(
            batch_size=1, row_groups=[group], columns=[name]
        )
        for batch in values:
            yield pc.max(pc.utf8_length(batch.column(0))).as_py() or 0
    except (pa.ArrowException, OSError) as exc:
        raise ForeignExportError(f"{where} is not a readable Parquet file: {_line(exc)}") from None


def _dense_bytes(where: str, name: str, column: pa.Array) -> int:
    """What `column` takes once decoded to plain arrays; text is checked to be UTF-8 first."""
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        raise ForeignExportError(
            f"{where}: column {name!r} holds text that is not valid UTF-8; the export is "
            "damaged, nothing was imported"
        ) from None
    if isinstance(column, pa.DictionaryArray):
        lengths = pc.take(pc.binary_length(column.dictionary), column.indices)
        return int(pc.sum(lengths).as_py() or 0) + 4 * (len(column) + 1)
    return column.nbytes


def _check_size(where: str, size: int, caps: TableCaps) -> None:
    if size > caps.decoded_bytes:
        raise ForeignExportError(
            f"{where} decodes to over {caps.decoded_bytes / MIB:.0f} MiB, the import limit per "
            "table (SKETCHWALK_IMPORT_MAX_DECODED_MB); nothing was imported"
        )


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
