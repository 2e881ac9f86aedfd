"""Parquet export and import: one file per run table plus manifest.json, or the same in a zip.

Parquet because every tool reads it (pandas, polars, DuckDB, Spark). The manifest names the
schema version and the run ids, so an import can refuse foreign or mismatched files before it
changes anything; the import itself is one transaction.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

import sketchwalk
from sketchwalk.settings import load as load_settings
from sketchwalk.store import schema, validate
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
MIB = 1 << 20


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

    def import_parquet(
        self,
        source: str | Path | bytes,
        skip_existing: bool = False,
        limits: ImportLimits | None = None,
    ) -> list[str]:
        """Load an export (folder, its manifest.json, a .zip path, or zip bytes) into this store.

        Everything is checked before the first write and loaded in one transaction. Runs already
        in the store are refused with RunExistsError (nothing changed) unless `skip_existing`,
        which leaves them as they are and imports the rest. Returns the imported run ids.
        """
        manifest, tables = _read_export(source, limits)
        ids = list(manifest["run_ids"])
        try:
            return self._load_export(ids, tables, skip_existing)
        except Exception as exc:  # rolled back: the database refused a row we let pass
            if not _is_driver_error(exc):
                raise
            raise ForeignExportError(
                f"the store refused the import, nothing was imported: {_line(exc.orig or exc)}"
            ) from None

    def _load_export(
        self, ids: list[str], tables: dict[str, pa.Table], skip_existing: bool
    ) -> list[str]:
        """All of an export's rows in one transaction (already validated)."""
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


@dataclass(frozen=True)
class ImportLimits:
    """Caps on what an import may read, checked before a byte is decompressed: a small zip can
    expand to gigabytes (a 300 KB zip held a 300 MB manifest). Sizes in bytes."""

    member_bytes: int = 2048 * MIB
    total_bytes: int = 8192 * MIB
    manifest_bytes: int = 16 * MIB

    @classmethod
    def from_settings(cls) -> ImportLimits:
        s = load_settings()
        return cls(
            member_bytes=s.import_max_member_mb * MIB, total_bytes=s.import_max_total_mb * MIB
        )


class _Budget:
    """Counts the bytes read so far against the limits; one per import."""

    def __init__(self, limits: ImportLimits, label: str) -> None:
        self.limits, self.label, self.used = limits, label, 0

    def take(self, name: str, size: int) -> int:
        """The most bytes `name` may have; raises when its declared `size` is already too big."""
        cap = self.limits.manifest_bytes if name == MANIFEST else self.limits.member_bytes
        if size > cap:
            raise ForeignExportError(
                f"{name} in {self.label} is {size / MIB:.0f} MiB, over the import limit of "
                f"{cap / MIB:.0f} MiB per file (SKETCHWALK_IMPORT_MAX_MB); nothing was imported"
            )
        if self.used + size > self.limits.total_bytes:
            raise ForeignExportError(
                f"{self.label} holds over {self.limits.total_bytes / MIB:.0f} MiB, the import "
                "limit (SKETCHWALK_IMPORT_MAX_TOTAL_MB); nothing was imported"
            )
        self.used += size
        return cap

    def read(self, name: str, stream: BinaryIO, declared: int) -> bytes:
        """Read at most the cap (+1 to notice a file that lied about its size)."""
        cap = self.take(name, declared)
        data = stream.read(cap + 1)
        if len(data) > cap or len(data) > declared:
            self.take(name, max(len(data), cap + 1))  # raises: over the cap
            raise ForeignExportError(f"{name} in {self.label} is larger than its zip entry says")
        return data


def _load_parquet(where: str, raw: bytes, table: sa.Table) -> pa.Table:
    """Read one table file, check it has exactly the store's columns (cast to their types) and
    that every row is something the store can hold and read back."""
    try:
        data = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError) as exc:
        raise ForeignExportError(f"{where} is not a readable Parquet file: {_line(exc)}") from None
    expected = arrow_schema(table)
    if sorted(data.column_names) != sorted(expected.names):
        raise ForeignExportError(
            f"{where} does not have the columns of sketchwalk's {table.name} table; "
            "not a sketchwalk export"
        )
    try:
        data = data.select(expected.names).cast(expected)
    except (pa.ArrowException, ValueError) as exc:
        raise ForeignExportError(f"{where}: column types do not match: {_line(exc)}") from None
    validate.check_table(where, table, data)
    return data


def _is_driver_error(exc: BaseException) -> bool:
    """A database's own error (SQLAlchemy-wrapped, or DuckDB's from the columnar fast path)."""
    if isinstance(exc, sa.exc.DBAPIError):
        return True
    duckdb = sys.modules.get("duckdb")
    return duckdb is not None and isinstance(exc, duckdb.Error)


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _manifest(raw: bytes, label: str) -> dict[str, Any]:
    """The parsed manifest with a valid format, schema version and run id list."""
    try:
        manifest = json.loads(raw)
    except ValueError:
        raise ForeignExportError(f"{MANIFEST} in {label} is not valid JSON") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ForeignExportError(f"{label} is not a sketchwalk export ({MANIFEST} format differs)")
    version = manifest.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ForeignExportError(
            f"{MANIFEST} in {label} has schema_version {str(version)[:40]!r}, not an integer; "
            "not a sketchwalk export"
        )
    check_version(version, what=f"export {label}")
    ids = manifest.get("run_ids")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ForeignExportError(f"{MANIFEST} in {label} has no valid run_ids list")
    bad = next((i for i in ids if not validate.is_run_id(i)), None)
    if bad is not None:
        raise ForeignExportError(
            f"{MANIFEST} in {label} lists {bad[:40]!r}, not a well-formed run id; nothing was imported"
        )
    if len(set(ids)) != len(ids):
        raise ForeignExportError(f"{MANIFEST} in {label} lists a run id twice")
    return manifest


def _read_export(
    source: str | Path | bytes, limits: ImportLimits | None = None
) -> tuple[dict[str, Any], dict[str, pa.Table]]:
    """Manifest and tables of an export, fully validated; raises ForeignExportError otherwise."""
    label = "the zip" if isinstance(source, (bytes, bytearray)) else str(source)
    files = _open_source(source, _Budget(limits or ImportLimits.from_settings(), label))
    raw_manifest = files(MANIFEST)
    if raw_manifest is None:
        raise ForeignExportError(
            f"{label} is not a sketchwalk export (no {MANIFEST}); import a folder or zip made "
            "by `sketchwalk export`"
        )
    manifest = _manifest(raw_manifest, label)
    ids = manifest["run_ids"]
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
    validate.check_blocks_in_range(
        f"block_scores.parquet in {label}", tables["block_scores"], tables["layer_stats"]
    )
    return manifest, tables


def _open_source(source: str | Path | bytes, budget: _Budget):
    """A function name -> bytes | None over an export folder, manifest path, zip path or bytes."""
    if isinstance(source, (bytes, bytearray)):
        return _zip_reader(io.BytesIO(bytes(source)), "the zip", budget)
    path = Path(source).expanduser()
    if not path.exists():
        raise ForeignExportError(f"{path} does not exist")
    if path.is_dir() or path.name == MANIFEST:
        folder = path if path.is_dir() else path.parent

        def read(name: str) -> bytes | None:
            file = folder / name
            if not file.is_file():
                return None
            try:
                with file.open("rb") as stream:
                    return budget.read(name, stream, file.stat().st_size)
            except OSError as exc:
                raise ForeignExportError(f"cannot read {file}: {exc.strerror or exc}") from None

        return read
    try:
        return _zip_reader(path.open("rb"), str(path), budget)
    except OSError as exc:
        raise ForeignExportError(f"cannot read {path}: {exc.strerror or exc}") from None


def _zip_reader(stream: BinaryIO, label: str, budget: _Budget):
    try:
        zf = zipfile.ZipFile(stream)
        infos = {info.filename: info for info in zf.infolist()}
    except (zipfile.BadZipFile, OSError, ValueError):
        raise ForeignExportError(
            f"{label} is not a sketchwalk export (neither an export folder nor a zip made by "
            "`sketchwalk export`)"
        ) from None
    manifests = [n for n in infos if n == MANIFEST or n.endswith("/" + MANIFEST)]
    if len(manifests) > 1:
        shown = ", ".join(sorted(manifests)[:3])
        raise ForeignExportError(
            f"{label} holds {len(manifests)} {MANIFEST} files ({shown}); an export zip holds "
            "one export: import them one at a time"
        )
    prefix = manifests[0][: -len(MANIFEST)] if manifests else ""

    def read(name: str) -> bytes | None:
        info = infos.get(prefix + name)
        if info is None:
            return None
        try:
            with zf.open(info) as member:
                return budget.read(name, member, info.file_size)
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
            raise ForeignExportError(f"{name} in {label} cannot be read: {_line(exc)}") from None

    return read
