"""Columnar reads and writes: fast paths on DuckDB and PostgreSQL, plain SQLAlchemy elsewhere.

The ORM (or executemany) moves a few ten thousand rows per second on a server; a 32k-token run
has about 4M block rows. On DuckDB we hand it the Arrow table itself (register + INSERT ...
SELECT) and read results back as Arrow; on PostgreSQL (psycopg 3) we stream CSV written and
read by Arrow through COPY. Both run inside the caller's transaction, so atomicity is kept.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

_CHUNK = 10_000
_COPY_CHUNK = 200_000  # rows per CSV buffer handed to COPY (bounded memory at 4M rows)


def arrow_type(column: sa.Column) -> pa.DataType:
    """The Arrow type a store column reads back as (fixes Parquet types, even for empty tables)."""
    t = column.type
    if isinstance(t, sa.Boolean):
        return pa.bool_()
    if isinstance(t, sa.BigInteger):
        return pa.int64()
    if isinstance(t, sa.Integer):
        return pa.int32()
    if isinstance(t, sa.REAL):
        return pa.float32()
    if isinstance(t, sa.Float):  # Double included
        return pa.float64()
    if isinstance(t, sa.DateTime):
        return pa.timestamp("us")
    return pa.string()


def arrow_schema(table: sa.Table, columns: list[str] | None = None) -> pa.Schema:
    names = columns or [c.name for c in table.columns]
    return pa.schema([pa.field(n, arrow_type(table.c[n])) for n in names])


def _is_duckdb(conn: Connection) -> bool:
    return conn.dialect.name == "duckdb"


def _is_copy_pg(conn: Connection) -> bool:
    """PostgreSQL through psycopg 3, whose cursors stream COPY (psycopg2 takes the generic path)."""
    return conn.dialect.name == "postgresql" and conn.dialect.driver == "psycopg"


def _raw_duckdb(conn: Connection) -> Any:
    """The DuckDB connection under `conn`, ready for columnar calls in the same transaction.

    DuckDB 2 refuses new work while an earlier execute() result (say, from `.first()`) is
    unread; complete() runs that (small, read-only) result to its end.
    """
    raw = conn.connection.driver_connection
    if hasattr(raw, "complete"):
        raw.complete()
    return raw


def _quote(conn: Connection, name: str) -> str:
    return conn.dialect.identifier_preparer.quote(name)


def insert_arrow(
    conn: Connection, table: sa.Table, data: pa.Table, const: dict[str, Any] | None = None
) -> int:
    """Append `data` (columns named as in `table`) plus constant columns `const`; return rows.

    Runs in the caller's transaction. Constants (the run id) are bound parameters, never text.
    """
    const = const or {}
    if data.num_rows == 0:
        return 0
    if _is_duckdb(conn):
        raw = _raw_duckdb(conn)
        view = f"sw_src_{uuid.uuid4().hex}"
        names = list(const) + list(data.column_names)
        target = ", ".join(_quote(conn, n) for n in names)
        source = ", ".join(["?"] * len(const) + [_quote(conn, n) for n in data.column_names])
        raw.register(view, data)
        try:
            raw.execute(
                f"INSERT INTO {_quote(conn, table.name)} ({target}) SELECT {source} FROM {view}",
                list(const.values()),
            )
        finally:
            raw.unregister(view)
        return data.num_rows
    if _is_copy_pg(conn):
        _copy_in(conn, table, data, const)
        return data.num_rows
    for batch in data.to_batches(max_chunksize=_CHUNK):
        rows = batch.to_pylist()
        if const:
            for row in rows:
                row.update(const)
        conn.execute(table.insert(), rows)
    return data.num_rows


STREAM_MEMORY = "256MB"
"""DuckDB's memory limit while a stream is inserted (its transaction spills past it)."""


@contextmanager
def streaming(engine: Engine) -> Iterator[None]:
    """Around a transaction that calls `insert_stream`: DuckDB on one thread and under
    STREAM_MEMORY (database-wide settings, reset to DuckDB's defaults after the transaction
    ended, committed or not). Statement by statement, or on several threads, DuckDB kept over 1 GB of a 1 GB import
    in memory until the commit; so it spills instead. Other databases: nothing to set."""
    if engine.dialect.name != "duckdb":
        yield
        return
    with engine.connect() as conn:
        raw = _raw_duckdb(conn)
        raw.execute("SET threads = 1")
        raw.execute(f"SET memory_limit = '{STREAM_MEMORY}'")
        try:
            yield
        finally:  # the store sets neither, so DuckDB's defaults are what it had
            raw.execute("RESET threads")
            raw.execute("RESET memory_limit")


def insert_stream(
    conn: Connection, table: sa.Table, schema: pa.Schema, batches: Iterable[pa.RecordBatch]
) -> None:
    """Append every batch of `batches` (pulled one at a time) in the caller's transaction; on
    DuckDB one INSERT reading a RecordBatchReader (see `streaming`). An exception the batches
    raise is raised as itself, not as DuckDB's wrapping of it."""
    if not _is_duckdb(conn):
        for batch in batches:
            insert_arrow(conn, table, pa.Table.from_batches([batch], schema=schema))
        return
    raised: list[BaseException] = []

    def pulled() -> Iterator[pa.RecordBatch]:
        try:
            yield from batches
        except BaseException as exc:
            raised.append(exc)
            raise

    raw = _raw_duckdb(conn)
    view = f"sw_src_{uuid.uuid4().hex}"
    names = ", ".join(_quote(conn, n) for n in schema.names)
    raw.register(view, pa.RecordBatchReader.from_batches(schema, pulled()))
    try:
        raw.execute(f"INSERT INTO {_quote(conn, table.name)} ({names}) SELECT {names} FROM {view}")
    except Exception:
        if raised:
            raise raised[0] from None
        raise
    finally:
        with suppress(Exception):  # an aborted transaction refuses even this; it ends soon
            raw.unregister(view)


def _copy_in(conn: Connection, table: sa.Table, data: pa.Table, const: dict[str, Any]) -> None:
    """COPY ... FROM STDIN (CSV) on the transaction's own psycopg connection.

    Arrow's CSV writer quotes every string (so "" is an empty string) and leaves nulls as bare
    empty fields, which is exactly PostgreSQL's CSV convention for NULL.
    """
    n = data.num_rows
    for name, value in reversed(list(const.items())):
        data = data.add_column(0, name, pa.array([value] * n, arrow_type(table.c[name])))
    columns = ", ".join(_quote(conn, c) for c in data.column_names)
    sql = f"COPY {_quote(conn, table.name)} ({columns}) FROM STDIN (FORMAT csv)"
    cursor = conn.connection.driver_connection.cursor()
    try:
        with cursor.copy(sql) as copy:
            for start in range(0, n, _COPY_CHUNK):
                buf = io.BytesIO()
                pacsv.write_csv(
                    data.slice(start, _COPY_CHUNK), buf, pacsv.WriteOptions(include_header=False)
                )
                copy.write(buf.getbuffer())
    finally:
        cursor.close()


def _copy_out(conn: Connection, stmt: sa.Select, schema: pa.Schema) -> pa.Table:
    """COPY (SELECT ...) TO STDOUT (CSV), parsed by Arrow into the store's column types.

    COPY takes no bind parameters, so the statement is rendered with literal values by the
    dialect's own quoting (our parameters are ids, phase names and integers).
    """
    sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    buf = io.BytesIO()
    cursor = conn.connection.driver_connection.cursor()
    try:
        with cursor.copy(f"COPY ({sql}) TO STDOUT (FORMAT csv)") as copy:
            for chunk in copy:
                buf.write(chunk)
    finally:
        cursor.close()
    if buf.tell() == 0:
        return schema.empty_table()
    buf.seek(0)
    return pacsv.read_csv(buf, **_csv_options(schema))


READ_BATCH_ROWS = 1 << 14
"""Rows per batch of a streamed read: at most 64 MiB of text even at the longest token text."""


def fetch_batches(
    conn: Connection, table: sa.Table, stmt: sa.Select, rows: int = READ_BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """A SELECT over `table`'s columns as Arrow batches of at most `rows` rows, with the store's
    column types, pulled one at a time: a read whose result may be as large as a table (an
    export) holds one batch, never the result. Close it (contextlib.closing) when it may be
    left before its end: until then the read holds the connection."""
    columns = [c.name for c in stmt.selected_columns]
    schema = arrow_schema(table, columns)
    if _is_duckdb(conn):
        compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        params = [compiled.params[name] for name in compiled.positiontup or ()]
        rel = _raw_duckdb(conn).sql(compiled.string, params=params or None)
        # duckdb >= 1.4 names it to_arrow_reader (fetch_record_batch is deprecated)
        reader = (
            rel.to_arrow_reader(rows)
            if hasattr(rel, "to_arrow_reader")
            else rel.fetch_record_batch(rows)
        )
        try:
            for batch in reader:
                yield batch.rename_columns(columns).cast(schema)
        finally:  # a read left part-way must not hold the connection (close the generator)
            reader.close()
        return
    if _is_copy_pg(conn):
        yield from _copy_out_batches(conn, stmt, schema, rows)
        return
    result = conn.execution_options(stream_results=True, yield_per=rows).execute(stmt)
    for part in result.partitions():
        yield pa.RecordBatch.from_pylist(
            [dict(zip(columns, row, strict=True)) for row in part], schema=schema
        )


class _CopyStream(io.RawIOBase):
    """A COPY TO STDOUT's chunks as a readable file, for Arrow's streaming CSV reader."""

    def __init__(self, chunks: Iterator[Any]) -> None:
        self.chunks, self.rest = chunks, memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self.rest:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.rest = memoryview(bytes(chunk))
        n = min(len(buffer), len(self.rest))
        buffer[:n] = self.rest[:n]
        self.rest = self.rest[n:]
        return n


def _copy_out_batches(
    conn: Connection, stmt: sa.Select, schema: pa.Schema, rows: int
) -> Iterator[pa.RecordBatch]:
    """`_copy_out`, parsed as it arrives (Arrow's reader holds one block of CSV at a time)."""
    sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    cursor = conn.connection.driver_connection.cursor()
    try:
        with cursor.copy(f"COPY ({sql}) TO STDOUT (FORMAT csv)") as copy:
            stream = io.BufferedReader(_CopyStream(iter(copy)), 1 << 20)
            if not stream.peek(1):
                return
            reader = pacsv.open_csv(stream, **_csv_options(schema, block_size=8 << 20))
            for batch in reader:
                for start in range(0, batch.num_rows, rows):
                    yield batch.slice(start, rows)
            for _ in copy:  # COPY ends once its data is read
                pass
    finally:
        cursor.close()


def _csv_options(schema: pa.Schema, block_size: int | None = None) -> dict[str, Any]:
    """How Arrow reads PostgreSQL's CSV into the store's column types."""
    read = pacsv.ReadOptions(column_names=schema.names)
    if block_size is not None:
        read.block_size = block_size
    return {
        "read_options": read,
        "parse_options": pacsv.ParseOptions(newlines_in_values=True),
        "convert_options": pacsv.ConvertOptions(
            column_types=dict(zip(schema.names, schema.types, strict=True)),
            null_values=[""],  # PostgreSQL writes NULL as a bare empty field ...
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,  # ... and an empty string as ""
            true_values=["t"],
            false_values=["f"],
        ),
    }


def fetch_arrow(conn: Connection, table: sa.Table, stmt: sa.Select) -> pa.Table:
    """Run a SELECT over `table`'s columns and return it as Arrow with the store's column types
    (a labelled expression, say a prefix or a length, typed as its own SQL type)."""
    columns = [c.name for c in stmt.selected_columns]
    schema = pa.schema(
        [pa.field(c.name, arrow_type(table.c.get(c.name, c))) for c in stmt.selected_columns]
    )
    if _is_duckdb(conn):
        compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        params = [compiled.params[name] for name in compiled.positiontup or ()]
        raw = _raw_duckdb(conn)
        rel = raw.sql(compiled.string, params=params or None)
        # duckdb >= 1.4 names it to_arrow_table (fetch_arrow_table is deprecated); older: arrow()
        result = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
        return result.rename_columns(columns).cast(schema)
    if _is_copy_pg(conn):
        return _copy_out(conn, stmt, schema)
    rows = [dict(zip(columns, row, strict=True)) for row in conn.execute(stmt)]
    return pa.Table.from_pylist(rows, schema=schema)
