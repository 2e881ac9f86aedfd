"""Columnar reads and writes: the fast path on DuckDB, plain SQLAlchemy everywhere else.

The ORM (or executemany) moves a few hundred thousand rows per second at best; a 32k-token run
has about 4M block rows. On DuckDB we hand it the Arrow table itself (register + INSERT ...
SELECT) and read results back as Arrow, inside the caller's transaction, so atomicity is kept.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection

_CHUNK = 10_000


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
    for batch in data.to_batches(max_chunksize=_CHUNK):
        rows = batch.to_pylist()
        if const:
            for row in rows:
                row.update(const)
        conn.execute(table.insert(), rows)
    return data.num_rows


def fetch_arrow(conn: Connection, table: sa.Table, stmt: sa.Select) -> pa.Table:
    """Run a SELECT over `table`'s columns and return it as Arrow with the store's column types."""
    columns = [c.name for c in stmt.selected_columns]
    schema = arrow_schema(table, columns)
    if _is_duckdb(conn):
        compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
        params = [compiled.params[name] for name in compiled.positiontup or ()]
        raw = _raw_duckdb(conn)
        rel = raw.sql(compiled.string, params=params or None)
        # duckdb >= 1.4 names it to_arrow_table (fetch_arrow_table is deprecated); older: arrow()
        result = rel.to_arrow_table() if hasattr(rel, "to_arrow_table") else rel.arrow()
        return result.rename_columns(columns).cast(schema)
    rows = [dict(zip(columns, row, strict=True)) for row in conn.execute(stmt)]
    return pa.Table.from_pylist(rows, schema=schema)
