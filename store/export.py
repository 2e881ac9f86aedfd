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
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

import sketchwalk
from sketchwalk.store import schema
from sketchwalk.store.bulk import fetch_arrow, streaming
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

    def _collect(self, run_ids: Iterable[str] | None) -> tuple[dict[str, pa.Table], dict]:
        """Each run table filtered to the runs (all when None) and the manifest describing them."""
        tables: dict[str, pa.Table] = {}
        with self._connect() as conn:
            known = [
                row[0]
                for row in conn.execute(
                    sa.select(schema.runs.c.id).order_by(schema.runs.c.created_at, schema.runs.c.id)
                )
            ]
            if run_ids is None:
                ids = known
            else:
                ids = list(dict.fromkeys(str(r) for r in run_ids))
                missing = sorted(set(ids) - set(known))
                if missing:
                    raise UnknownRunError(
                        f"no run with id {', '.join(map(repr, missing))} in this store"
                    )
            for table in schema.RUN_TABLES:
                key = schema.run_key(table)
                stmt = sa.select(table)
                if run_ids is not None:
                    stmt = stmt.where(key.in_(ids)) if ids else stmt.where(sa.false())
                tables[table.name] = clean_strings(fetch_arrow(conn, table, stmt))
        manifest = {
            "format": FORMAT,
            "schema_version": schema.SCHEMA_VERSION,
            "sketchwalk_version": sketchwalk.__version__,
            "created_at": utcnow().isoformat(),
            "run_ids": ids,
            "tables": {
                name: {"file": f"{name}.parquet", "rows": data.num_rows}
                for name, data in tables.items()
            },
        }
        return tables, manifest

    @staticmethod
    def _parquet_bytes(name: str, data: pa.Table) -> bytes:
        meta = {
            b"sketchwalk.table": name.encode(),
            b"sketchwalk.schema_version": b"%d" % schema.SCHEMA_VERSION,
        }
        data = data.replace_schema_metadata({**(data.schema.metadata or {}), **meta})
        sink = io.BytesIO()
        pq.write_table(data, sink, compression="zstd")
        return sink.getvalue()

    def export_parquet(self, run_ids: Iterable[str] | None, out_dir: str | Path) -> list[Path]:
        """Write one Parquet file per run table (filtered to `run_ids`, all when None) and
        manifest.json into `out_dir` (created if needed); returns the paths, manifest last."""
        tables, manifest = self._collect(run_ids)
        out = Path(out_dir).expanduser()
        written: list[Path] = []  # each file joins as it starts: a half-written one goes too
        try:
            out.mkdir(parents=True, exist_ok=True)
            for name, data in tables.items():
                path = out / manifest["tables"][name]["file"]
                payload = self._parquet_bytes(name, data)
                written.append(path)
                path.write_bytes(payload)
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

    def export_zip(self, run_ids: Iterable[str] | None) -> bytes:
        """The same export as a single zip (Parquet files and manifest.json at its root)."""
        tables, manifest = self._collect(run_ids)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
            for name, data in tables.items():
                zf.writestr(manifest["tables"][name]["file"], self._parquet_bytes(name, data))
            zf.writestr(MANIFEST, json.dumps(manifest, indent=2) + "\n")
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


def _is_driver_error(exc: BaseException) -> bool:
    """A database's own error (SQLAlchemy-wrapped, or DuckDB's from the columnar fast path)."""
    if isinstance(exc, sa.exc.DBAPIError):
        return True
    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(exc, duckdb.Error)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
