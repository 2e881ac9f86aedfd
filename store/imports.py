"""Reading an export for import: an untrusted folder or zip, checked and bounded before any write.

A zip's members are copied to a temporary folder in 1 MiB pieces (never held whole in memory)
and the tables are read from there, batch by batch (store/decode.py, store/import_load.py).

The caps, each refused in one line with nothing imported:
- bytes read per file and in all (the zip's declared sizes first, then what really comes out,
  counted while copying);
- the manifest's row counts per table: each within the import's row cap and, for tables keyed
  by a bounded value (tokens, blocks), within what its runs can hold; each file must hold
  exactly those rows, counted while it is read (store/decode.py);
- decoded bytes per table, counted while reading, before the table is materialised;
- every value that sizes memory later within the store's own limits (store/limits.py).
"""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import sqlalchemy as sa

from sketchwalk.settings import load as load_settings
from sketchwalk.store import limits, schema, validate
from sketchwalk.store.db import check_version
from sketchwalk.store.errors import ForeignExportError

MANIFEST = "manifest.json"
FORMAT = "sketchwalk-export"
MIB = 1 << 20
COPY_BYTES = MIB  # a zip member is copied out in pieces of this size


def table_file(table: sa.Table) -> str:
    return f"{table.name}.parquet"


@dataclass(frozen=True)
class ImportLimits:
    """Caps on what an import may read and decode. Compressed sizes are checked before a byte
    is decompressed (a 300 KB zip held a 300 MB manifest), decoded rows and bytes while each
    table is read. Sizes in bytes."""

    member_bytes: int = 2048 * MIB
    total_bytes: int = 8192 * MIB
    manifest_bytes: int = 16 * MIB
    decoded_bytes: int = 1024 * MIB  # per table, once decoded
    rows: int = 1 << 25  # per table

    @classmethod
    def from_settings(cls) -> ImportLimits:
        s = load_settings()
        return cls(
            member_bytes=s.import_max_member_mb * MIB,
            total_bytes=s.import_max_total_mb * MIB,
            decoded_bytes=s.import_max_decoded_mb * MIB,
            rows=s.import_max_rows,
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

    def copy(self, name: str, stream: BinaryIO, declared: int, target: Path) -> Path:
        """Copy `stream` to `target` in COPY_BYTES pieces, refusing at the first byte past the
        cap or past the size the zip declared (memory holds one piece)."""
        cap = self.take(name, declared)
        written = 0
        with target.open("wb") as out:
            while piece := stream.read(COPY_BYTES):
                written += len(piece)
                if written > cap or written > declared:
                    self.take(name, max(written, cap + 1))  # raises: over the cap
                    raise ForeignExportError(
                        f"{name} in {self.label} is larger than its zip entry says"
                    )
                out.write(piece)
        return target


def _manifest(raw: bytes, label: str) -> dict[str, Any]:
    """The parsed manifest with a valid format, schema version, run id list and row counts."""
    try:
        manifest = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nested thousands of levels deep
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


def _row_caps(manifest: dict[str, Any], label: str, caps: ImportLimits) -> dict[str, int]:
    """Rows each table file must hold: the manifest's count, checked against the caps."""
    tables = manifest.get("tables")
    n_runs = len(manifest["run_ids"])
    out: dict[str, int] = {}
    for table in schema.RUN_TABLES:
        entry = tables.get(table.name) if isinstance(tables, dict) else None
        rows = entry.get("rows") if isinstance(entry, dict) else None
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ForeignExportError(
                f"{MANIFEST} in {label} gives no row count for {table.name}; not a sketchwalk "
                "export"
            )
        per_run = limits.ROWS_PER_RUN.get(table.name)
        most = min(caps.rows, n_runs * per_run) if per_run is not None else caps.rows
        if rows > most:
            raise ForeignExportError(
                f"{MANIFEST} in {label} declares {rows:,} {table.name} rows, over the "
                f"{most:,} allowed ({_why(per_run, n_runs)}); nothing was imported"
            )
        out[table.name] = rows
    return out


def _why(per_run: int | None, n_runs: int) -> str:
    if per_run is None:
        return "SKETCHWALK_IMPORT_MAX_ROWS per table"
    return f"{per_run:,} per run for {n_runs} run(s), or SKETCHWALK_IMPORT_MAX_ROWS"


@dataclass(frozen=True)
class Export:
    """An opened export: its checked manifest, the rows each table file must hold, and where
    each table file lies on disk (None: missing)."""

    label: str
    manifest: dict[str, Any]
    rows: dict[str, int]
    files: dict[str, Path | None]
    caps: ImportLimits

    @property
    def run_ids(self) -> list[str]:
        return list(self.manifest["run_ids"])


@contextmanager
def open_export(source: str | Path | bytes, caps: ImportLimits | None = None) -> Iterator[Export]:
    """The manifest checked and every table file on disk (a zip's copied to a temporary folder,
    removed on exit); raises ForeignExportError (one line) when it is no sketchwalk export."""
    caps = caps or ImportLimits.from_settings()
    label = "the zip" if isinstance(source, (bytes, bytearray)) else str(source)
    with tempfile.TemporaryDirectory(prefix="sketchwalk-import-") as scratch:
        files = _open_source(source, _Budget(caps, label), Path(scratch))
        raw_manifest = files(MANIFEST)
        if raw_manifest is None:
            raise ForeignExportError(
                f"{label} is not a sketchwalk export (no {MANIFEST}); import a folder or zip "
                "made by `sketchwalk export`"
            )
        manifest = _manifest(raw_manifest.read_bytes(), label)
        rows = _row_caps(manifest, label, caps)
        paths = {table.name: files(table_file(table)) for table in schema.RUN_TABLES}
        missing = next((t for t in schema.RUN_TABLES if paths[t.name] is None), None)
        if missing is not None:
            raise ForeignExportError(
                f"{label} lacks {table_file(missing)}; the export is incomplete"
            )
        yield Export(label, manifest, rows, paths, caps)


def _open_source(source: str | Path | bytes, budget: _Budget, scratch: Path):
    """A function name -> Path | None over an export folder, manifest path, zip path or bytes
    (a zip member is copied under `scratch`, a folder's file is used where it is)."""
    if isinstance(source, (bytes, bytearray)):
        return _zip_reader(io.BytesIO(bytes(source)), "the zip", budget, scratch)
    path = Path(source).expanduser()
    if not path.exists():
        raise ForeignExportError(f"{path} does not exist")
    if path.is_dir() or path.name == MANIFEST:
        folder = path if path.is_dir() else path.parent

        def find(name: str) -> Path | None:
            file = folder / name
            if not file.is_file():
                return None
            try:
                size = file.stat().st_size
            except OSError as exc:
                raise ForeignExportError(f"cannot read {file}: {exc.strerror or exc}") from None
            if name == MANIFEST:  # read here: the manifest is parsed from these bytes
                with file.open("rb") as stream:
                    data = budget.read(name, stream, size)
                copy = scratch / name
                copy.write_bytes(data)
                return copy
            budget.take(name, size)
            return file

        return find
    try:
        return _zip_reader(path.open("rb"), str(path), budget, scratch)
    except OSError as exc:
        raise ForeignExportError(f"cannot read {path}: {exc.strerror or exc}") from None


def _zip_reader(stream: BinaryIO, label: str, budget: _Budget, scratch: Path):
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

    def copy(name: str) -> Path | None:
        info = infos.get(prefix + name)
        if info is None:
            return None
        try:
            with zf.open(info) as member:
                if name == MANIFEST:
                    target = scratch / name
                    target.write_bytes(budget.read(name, member, info.file_size))
                    return target
                return budget.copy(name, member, info.file_size, scratch / name)
        except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError) as exc:
            raise ForeignExportError(f"{name} in {label} cannot be read: {_line(exc)}") from None

    return copy


def _line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
