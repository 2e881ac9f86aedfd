"""One table file of an import, decoded within its caps: rows and bytes counted while reading.

A Parquet file is small on disk and large in memory: a 325 KB file of 10M constant rows decoded
to 1.35 GB, a 2 MB zip held a 2 GB tokens table. So a file is never read whole. Its footer's row
count must match the manifest and fit the caps, its declared decoded size must fit, and then it
is read in batches (strings kept dictionary-encoded) whose rows and dense size (what the table
will take once decoded) are counted as they come; the read stops at the first cap crossed, before
the table is materialised. Text must be valid UTF-8.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa

from sketchwalk.store.bulk import arrow_schema
from sketchwalk.store.errors import ForeignExportError

MIB = 1 << 20
BATCH_ROWS = 1 << 16


@dataclass(frozen=True)
class TableCaps:
    """What one table file may decode to: rows (from the manifest, already capped) and bytes."""

    rows: int
    decoded_bytes: int


def decode_table(where: str, raw: bytes, table: sa.Table, caps: TableCaps) -> pa.Table:
    """`raw` as the store's `table`: exactly its columns, cast to their types, within `caps`."""
    expected = arrow_schema(table)
    strings = [f.name for f in expected if f.type == pa.string()]
    try:
        names = pq.ParquetFile(pa.BufferReader(raw)).schema_arrow.names  # the footer only
        if sorted(names) != sorted(expected.names):
            raise ForeignExportError(
                f"{where} does not have the columns of sketchwalk's {table.name} table; "
                "not a sketchwalk export"
            )
        parquet = pq.ParquetFile(pa.BufferReader(raw), read_dictionary=strings)
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
    batches = _batches(where, parquet, expected.names, caps)
    try:
        data = pa.Table.from_batches(batches, schema=batches[0].schema) if batches else None
        if data is None:
            return expected.empty_table()
        return data.select(expected.names).cast(expected)
    except (pa.ArrowException, ValueError) as exc:
        raise ForeignExportError(f"{where}: column types do not match: {_line(exc)}") from None


def _batches(
    where: str, parquet: pq.ParquetFile, columns: list[str], caps: TableCaps
) -> list[pa.RecordBatch]:
    """Every batch of the file, counting rows and dense bytes against the caps as they come."""
    out: list[pa.RecordBatch] = []
    rows = size = 0
    try:
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            rows += batch.num_rows
            if rows > caps.rows:
                raise ForeignExportError(
                    f"{where} holds more rows than its footer and manifest say ({caps.rows}); "
                    "nothing was imported"
                )
            size += sum(_dense_bytes(where, name, batch.column(name)) for name in columns)
            _check_size(where, size, caps)
            out.append(batch)
    except (pa.ArrowException, OSError) as exc:
        raise ForeignExportError(f"{where} is not a readable Parquet file: {_line(exc)}") from None
    return out


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
