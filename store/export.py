"""Parquet export and import: one file per run table plus manifest.json, or the same in a zip.

Parquet because every tool reads it (pandas, polars, DuckDB, Spark). The manifest names the
schema version and the run ids, so an import can refuse foreign or mismatched files before it
changes anything; the import itself is one transaction, written batch by batch as each is
checked (store/import_load.py), so a refusal part-way rolls all of it back.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, closing, contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

import sketchwalk
from sketchwalk.store import schema
from sketchwalk.store.bulk import arrow_schema, fetch_batches, streaming
from sketchwalk.store.db import utcnow
from sketchwalk.store.errors import (
    ExportError,
    ForeignExportError,
    RunExistsError,
    UnknownRunError,
)
from sketchwalk.store.frames import clean_strings
from sketchwalk.store.import_load import load_export
from sketchwalk.store.imports import FORMAT, MANIFEST, Export, ImportLimits, open_export, table_file

__all__ = ["FORMAT", "MANIFEST", "ExportMixin", "ImportLimits", "table_file"]


class ExportMixin:
    """Export/import methods of `Store`; expects `self._begin()` / `self._connect()`."""

    engine: Engine

    def _begin(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    def _connect(self) -> AbstractContextManager[Connection]:  # provided by Store
        raise NotImplementedError

    # ---- export -------------------------------------------------------------------------

    def _export_ids(self, conn: Connection, run_ids: Iterable[str] | None) -> list[str]:
        """The runs to export (all, oldest first, when None); unknown ids refused in one line."""
        known = [
            row[0]
            for row in conn.execute(
                sa.select(schema.runs.c.id).order_by(schema.runs.c.created_at, schema.runs.c.id)
            )
        ]
        if run_ids is None:
            return known
        ids = list(dict.fromkeys(str(r) for r in run_ids))
        missing = sorted(set(ids) - set(known))
        if missing:
            raise UnknownRunError(f"no run with id {', '.join(map(repr, missing))} in this store")
        return ids

    def export_ids(self, run_ids: Iterable[str] | None) -> list[str]:
        """The run ids an export of `run_ids` writes; raises UnknownRunError for one not here."""
        with self._connect() as conn:
            return self._export_ids(conn, run_ids)

    def _write_export(
        self, run_ids: Iterable[str] | None, sink: Callable[[str], AbstractContextManager[Any]]
    ) -> dict[str, Any]:
        """Each run table, filtered to the runs, streamed batch by batch into the Parquet file
        `sink(name)` opens (a path or a zip member); returns the manifest describing them."""
        counts: dict[str, int] = {}
        with self._connect() as conn:
            ids = self._export_ids(conn, run_ids)
            for table in schema.RUN_TABLES:
                stmt = sa.select(table).where(schema.run_key(table).in_(ids) if ids else sa.false())
                with (
                    sink(table_file(table)) as out,
                    closing(fetch_batches(conn, table, stmt)) as rows,
                ):
                    counts[table.name] = _write_parquet(out, table, rows)
        return {
            "format": FORMAT,
            "schema_version": schema.SCHEMA_VERSION,
            "sketchwalk_version": sketchwalk.__version__,
            "created_at": utcnow().isoformat(),
            "run_ids": ids,
            "tables": {
                name: {"file": f"{name}.parquet", "rows": rows} for name, rows in counts.items()
            },
        }

    def export_parquet(self, run_ids: Iterable[str] | None, out_dir: str | Path) -> list[Path]:
        """Write one Parquet file per run table (filtered to `run_ids`, all when None) and
        manifest.json into `out_dir` (created if needed); returns the paths, manifest last.
        Memory holds one batch of rows (store/bulk.py), whatever the runs' size."""
        out = Path(out_dir).expanduser()
        written: list[Path] = []  # each file joins as it starts: a half-written one goes too

        @contextmanager
        def sink(name: str) -> Iterator[BinaryIO]:
            path = out / name
            written.append(path)
            with path.open("wb") as file:
                yield file

        try:
            self.export_ids(run_ids)  # unknown runs refused before anything is created
            out.mkdir(parents=True, exist_ok=True)
            manifest = self._write_export(run_ids, sink)
            path = out / MANIFEST
            written.append(path)
            path.write_text(json.dumps(manifest, indent=2) + "\n")
        except BaseException as exc:  # a full disk, or an interrupt: no partial export is left
            for path in written:
                path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise ExportError(
                    f"cannot write the export to {out}: {exc.strerror or exc}; "
                    "choose a writable --out"
                ) from None
            raise
        return written

    def write_zip(self, run_ids: Iterable[str] | None, stream: BinaryIO) -> None:
        """The same export as one zip written into `stream` (Parquet files and manifest.json
        at its root), each member streamed in as its rows are read."""
        with zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_STORED) as zf:

            def sink(name: str) -> AbstractContextManager[BinaryIO]:
                return zf.open(name, "w", force_zip64=True)

            manifest = self._write_export(run_ids, sink)
            zf.writestr(MANIFEST, json.dumps(manifest, indent=2) + "\n")

    def export_zip(self, run_ids: Iterable[str] | None) -> bytes:
        """`write_zip` into memory (the app's download button wants bytes)."""
        buf = io.BytesIO()
        self.write_zip(run_ids, buf)
        return buf.getvalue()

    # ---- import -------------------------------------------------------------------------

    def import_parquet(
        self,
        source: str | Path | bytes,
        skip_existing: bool = False,
        limits: ImportLimits | None = None,
    ) -> list[str]:
        """Load an export (folder, its manifest.json, a .zip path, or zip bytes) into this store.

        Every row is checked before it is written, all in one transaction (a refusal rolls the
        whole import back), one table batch in memory at a time. Runs already
        in the store are refused with RunExistsError (nothing changed) unless `skip_existing`,
        which leaves them as they are and imports the rest. Returns the imported run ids.
        """
        with open_export(source, limits) as export:
            try:
                return self._load_export(export, skip_existing)
            except Exception as exc:  # rolled back: the database refused a row we let pass
                if not _is_driver_error(exc):
                    raise
                cause = getattr(exc, "orig", None) or exc  # DuckDB's own errors carry no .orig
                raise ForeignExportError(
                    f"the store refused the import, nothing was imported: {_line(cause)}"
                ) from None

    def _load_export(self, export: Export, skip_existing: bool) -> list[str]:
        """All of an export's rows in one transaction, checked batch by batch as they go in."""
        ids = export.run_ids
        with streaming(self.engine), self._begin() as conn:
            present = (
                {
                    row[0]
                    for row in conn.execute(
                        sa.select(schema.runs.c.id).where(schema.runs.c.id.in_(ids))
                    )
                }
                if ids
                else set()
            )
            if present and not skip_existing:
                raise RunExistsError(
                    f"{len(present)} run(s) of this export are already in the store "
                    f"({', '.join(sorted(present)[:3])}); delete them first or skip existing runs (--skip-existing)"
                )
            new = [i for i in ids if i not in present]
            if new:
                load_export(conn, export, new)
        return new


def _write_parquet(out: BinaryIO, table: sa.Table, batches: Iterable[pa.RecordBatch]) -> int:
    """Every batch into one Parquet file (zstd, a row group per batch, the table's name and
    schema version in its metadata); returns the rows written."""
    meta = {
        b"sketchwalk.table": table.name.encode(),
        b"sketchwalk.schema_version": b"%d" % schema.SCHEMA_VERSION,
    }
    full = arrow_schema(table).with_metadata(meta)
    rows = 0
    with pq.ParquetWriter(out, full, compression="zstd") as writer:
        for batch in batches:
            writer.write_table(clean_strings(pa.Table.from_batches([batch])))
            rows += batch.num_rows
    return rows


def _is_driver_error(exc: BaseException) -> bool:
    """A database's own error (SQLAlchemy-wrapped, or DuckDB's from the columnar fast path)."""
    if isinstance(exc, sa.exc.DBAPIError):
        return True
    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(exc, duckdb.Error)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
