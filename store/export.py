"""Parquet export and import: one file per run table plus manifest.json, or the same in a zip.

Parquet because every tool reads it (pandas, polars, DuckDB, Spark). The manifest names the
schema version and the run ids, so an import can refuse foreign or mismatched files before it
changes anything; the import itself is one transaction.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

import sketchwalk
from sketchwalk.store import schema
from sketchwalk.store.bulk import arrow_schema, fetch_arrow, insert_arrow
from sketchwalk.store.db import check_version, utcnow
from sketchwalk.store.errors import (
    ExportError,
    ForeignExportError,
    RunExistsError,
    UnknownRunError,
)

MANIFEST = "manifest.json"
FORMAT = "sketchwalk-export"


def table_file(table: sa.Table) -> str:
    return f"{table.name}.parquet"


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
                tables[table.name] = fetch_arrow(conn, table, stmt)
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
        written: list[Path] = []
        try:
            out.mkdir(parents=True, exist_ok=True)
            for name, data in tables.items():
                path = out / manifest["tables"][name]["file"]
                path.write_bytes(self._parquet_bytes(name, data))
                written.append(path)
            path = out / MANIFEST
            path.write_text(json.dumps(manifest, indent=2) + "\n")
            written.append(path)
        except OSError as exc:
            for path in written:
                path.unlink(missing_ok=True)
            raise ExportError(
                f"cannot write the export to {out}: {exc.strerror or exc}; choose a writable --out"
            ) from None
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

    def import_parquet(self, source: str | Path | bytes, skip_existing: bool = False) -> list[str]:
        """Load an export (folder, its manifest.json, a .zip path, or zip bytes) into this store.

        Everything is checked before the first write and loaded in one transaction. Runs already
        in the store are refused with RunExistsError (nothing changed) unless `skip_existing`,
        which leaves them as they are and imports the rest. Returns the imported run ids.
        """
        manifest, tables = _read_export(source)
        ids = list(manifest["run_ids"])
        with self._begin() as conn:
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
                for table in schema.RUN_TABLES:
                    data = tables[table.name]
                    if present:
                        key = schema.run_key(table).name
                        data = data.filter(pc.is_in(data[key], pa.array(new)))
                    insert_arrow(conn, table, data)
        return new


def _load_parquet(where: str, raw: bytes, table: sa.Table) -> pa.Table:
    """Read one table file and check it has exactly the store's columns, cast to their types."""
    try:
        data = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError) as exc:
        raise ForeignExportError(f"{where} is not a readable Parquet file: {exc}") from None
    expected = arrow_schema(table)
    if sorted(data.column_names) != sorted(expected.names):
        raise ForeignExportError(
            f"{where} does not have the columns of sketchwalk's {table.name} table; "
            "not a sketchwalk export"
        )
    try:
        return data.select(expected.names).cast(expected)
    except (pa.ArrowException, ValueError) as exc:
        raise ForeignExportError(f"{where}: column types do not match: {exc}") from None


def _read_export(source: str | Path | bytes) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """Manifest and tables of an export, fully validated; raises ForeignExportError otherwise."""
    files = _open_source(source)
    label = "the zip" if isinstance(source, (bytes, bytearray)) else str(source)
    raw_manifest = files(MANIFEST)
    if raw_manifest is None:
        raise ForeignExportError(
            f"{label} is not a sketchwalk export (no {MANIFEST}); import a folder or zip made "
            "by `sketchwalk export`"
        )
    try:
        manifest = json.loads(raw_manifest)
    except ValueError:
        raise ForeignExportError(f"{MANIFEST} in {label} is not valid JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ForeignExportError(f"{label} is not a sketchwalk export ({MANIFEST} format differs)")
    check_version(int(manifest.get("schema_version", -1)), what=f"export {label}")
    ids = manifest.get("run_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ForeignExportError(f"{MANIFEST} in {label} has no valid run_ids list")
    tables: dict[str, pa.Table] = {}
    for table in schema.RUN_TABLES:
        raw = files(table_file(table))
        if raw is None:
            raise ForeignExportError(f"{label} lacks {table_file(table)}; the export is incomplete")
        data = _load_parquet(f"{table_file(table)} in {label}", raw, table)
        owners = set(data[schema.run_key(table).name].unique().to_pylist())
        if table is schema.runs and owners != set(ids):
            raise ForeignExportError(
                f"runs.parquet in {label} does not match the manifest's run ids"
            )
        if not owners <= set(ids):
            raise ForeignExportError(
                f"{table_file(table)} in {label} holds rows of runs not in the manifest"
            )
        tables[table.name] = data
    return manifest, tables


def _open_source(source: str | Path | bytes):
    """A function name -> bytes | None over an export folder, manifest path, zip path or bytes."""
    if isinstance(source, (bytes, bytearray)):
        return _zip_reader(bytes(source), "the zip")
    path = Path(source).expanduser()
    if not path.exists():
        raise ForeignExportError(f"{path} does not exist")
    if path.is_dir() or path.name == MANIFEST:
        folder = path if path.is_dir() else path.parent

        def read(name: str) -> bytes | None:
            file = folder / name
            return file.read_bytes() if file.is_file() else None

        return read
    try:
        return _zip_reader(path.read_bytes(), str(path))
    except OSError as exc:
        raise ForeignExportError(f"cannot read {path}: {exc.strerror or exc}") from None


def _zip_reader(data: bytes, label: str):
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        names = zf.namelist()
    except zipfile.BadZipFile:
        raise ForeignExportError(
            f"{label} is not a sketchwalk export (neither an export folder nor a zip made by "
            "`sketchwalk export`)"
        ) from None
    manifests = [n for n in names if n == MANIFEST or n.endswith("/" + MANIFEST)]
    prefix = manifests[0][: -len(MANIFEST)] if len(manifests) == 1 else ""

    def read(name: str) -> bytes | None:
        try:
            return zf.read(prefix + name)
        except KeyError:
            return None

    return read
