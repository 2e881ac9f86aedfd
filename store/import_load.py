"""Writing an opened export (store/imports.py) into the store: one transaction, one batch of
one table in memory at a time.

Each batch is decoded within the caps (store/decode.py), checked by every row rule
(store/validate.py) and written before the next is read; what spans batches is kept small and
checked at the end (each table's run ids, the largest query block of each recorded layer, and
layer_stats' keys with n_blocks), and a key repeated across batches is refused by the table's
primary key (block_scores, which has none, by one query once its rows are in). Any refusal raises inside the transaction, so nothing of the import stays.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sketchwalk.store import schema, validate
from sketchwalk.store.bulk import arrow_schema, insert_stream
from sketchwalk.store.decode import TableCaps, decode_chunks
from sketchwalk.store.errors import ForeignExportError
from sketchwalk.store.imports import Export, table_file


def load_export(conn: Connection, export: Export, new: list[str]) -> None:
    """Check and write every table of `export`, keeping only the runs in `new` (the others
    are already in the store and skipped); raises ForeignExportError on the first bad row."""
    ids = set(export.run_ids)
    keep = pa.array(new, pa.string()) if len(new) < len(ids) else None
    stats_keys: list[pa.Table] = []
    tops: list[pa.Table] = []
    for table in schema.RUN_TABLES:
        where = f"{table_file(table)} in {export.label}"
        owners: set[str] = set()

        def checked(table: sa.Table = table, where: str = where, owners: set[str] = owners):
            """The file's batches, each checked before it is handed on (to be written)."""
            caps = TableCaps(export.rows[table.name], export.caps.decoded_bytes)
            key = schema.run_key(table).name
            offset = 0
            path = export.files[table.name]
            assert path is not None  # open_export refuses a missing table file
            for chunk in decode_chunks(where, path, table, caps):
                validate.check_table(where, table, chunk, offset)
                offset += chunk.num_rows
                owners.update(pc.unique(chunk[key]).to_pylist())
                if not owners <= ids:
                    raise ForeignExportError(f"{where} holds rows of runs not in the manifest")
                if table is schema.layer_stats:
                    stats_keys.append(chunk.select([*validate.LAYER_KEYS, "n_blocks"]))
                elif table is schema.block_scores:
                    tops.append(validate.top_blocks(chunk))
                if keep is not None:
                    chunk = chunk.filter(pc.is_in(chunk[key], keep))
                yield from chunk.to_batches()

        _insert(conn, table, checked(), where)
        if table is schema.runs and owners != ids:
            raise ForeignExportError(
                f"runs.parquet in {export.label} does not match the manifest's run ids"
            )
    stats = _concat(stats_keys, schema.layer_stats, [*validate.LAYER_KEYS, "n_blocks"])
    scores = pa.concat_tables(tops) if tops else None
    if scores is not None:
        where = f"block_scores.parquet in {export.label}"
        validate.check_blocks_in_range(where, scores, stats)
        _check_scores_unique(conn, where, new)


def _check_scores_unique(conn: Connection, where: str, new: list[str]) -> None:
    """No block pair is scored twice in a layer: a layer then holds at most its n (n + 1) / 2
    causal pairs, which is what reading it may cost (the table has no primary key, so the
    database counts them once all are in)."""
    t = schema.block_scores
    keys = [t.c.run_id, t.c.phase, t.c.step, t.c.layer, t.c.q_block, t.c.k_block]
    twice = conn.execute(
        sa.select(t.c.run_id)
        .where(t.c.run_id.in_(new))
        .group_by(*keys)
        .having(sa.func.count() > 1)
        .limit(1)
    ).first()
    if twice is not None:
        raise ForeignExportError(
            f"{where}: rows of run {twice[0]!r} score the same block pair twice in a layer; the "
            "export is damaged, nothing was imported"
        )


def _concat(parts: list[pa.Table], table: sa.Table, columns: list[str]) -> pa.Table:
    if parts:
        return pa.concat_tables(parts)
    full = arrow_schema(table)
    return pa.schema([full.field(c) for c in columns]).empty_table()


def _insert(conn: Connection, table: sa.Table, batches, where: str) -> None:
    """Every batch; a primary key the database refuses is a key repeated across batches."""
    try:
        insert_stream(conn, table, arrow_schema(table), batches)
    except Exception as exc:
        if not _is_key_conflict(exc):
            raise
        raise ForeignExportError(
            f"{where}: rows repeat the key of other rows (the table's primary key); the export "
            "is damaged, nothing was imported"
        ) from None


def _is_key_conflict(exc: BaseException) -> bool:
    if isinstance(exc, sa.exc.IntegrityError):
        return True
    import sys

    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(exc, duckdb.ConstraintException)
