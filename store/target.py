"""What `--db` (and SKETCHWALK_DB) may name, parsed once into a `Target`: a database file
(DuckDB, or SQLite by URL), a server URL, or an in-memory database (only when the URL says
`:memory:`).

DuckDB opens almost anything it is given (a JSON file, a path cut at a NUL byte, a FIFO it then
waits on), and a run "saved" into what it made of it is lost. So before a store is opened, and
before anything is created, a target is refused in one line when it holds a NUL byte (raw or
`%00`), names a folder (existing, or a missing one spelled with a trailing `/`), a FIFO or a
device, an existing file of another kind, a new file named like data (`.json`) or with any
suffix but a database's, or a new file in a folder that does not exist (only the default data
folder is created).

Server URLs are parsed here too: a password holding `@` (or `/`, `?`, `#`) is split at the
last `@`, so no part of it is ever taken for the host and shown in an error.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

from sketchwalk.store.errors import StoreCorruptError, StoreError

DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of every DuckDB database file
SQLITE_MAGIC = b"SQLite format 3\x00"
DATA_SUFFIXES = frozenset(
    (".json", ".jsonl", ".ndjson", ".csv", ".tsv", ".txt", ".parquet", ".zip", ".gz", ".zst")
    + (".arrow", ".feather", ".ipc", ".xlsx", ".xls", ".toml", ".yaml", ".yml", ".md", ".html")
    + (".safetensors", ".pt", ".bin", ".npy", ".npz", ".pkl", ".py")
)
"""New paths with these names are refused: a data file, not a store (DuckDB reads some in place)."""
DB_SUFFIXES = frozenset(("", ".duckdb", ".ddb", ".db", ".db3", ".sqlite", ".sqlite3"))
"""What a new database file may be named (an existing database is opened whatever its name)."""
HEADER_BYTES = 16
FILE_BACKENDS = ("duckdb", "sqlite")


@dataclass(frozen=True)
class Target:
    """A parsed `--db`: `url` is what the engine is given; `path` the file of a "file" target."""

    kind: Literal["file", "server", "memory"]
    url: str
    backend: str
    path: Path | None = None


def parse_target(text: str) -> Target:
    """`--db` or SKETCHWALK_DB as a Target; raises StoreError (one line) on what names no
    database. Reads nothing but the text: the file checks are `check_file`'s."""
    if "\x00" in text or "%00" in text:
        raise StoreError(
            f"--db {_scrub(text.replace(chr(0), '%00'))!r} holds a NUL byte (raw or %00), which "
            "no path or URL may hold; nothing was opened"
        )
    if not text.strip():
        raise StoreError("--db is empty; give a DuckDB file or a server URL, or leave it out")
    if "://" not in text:
        if text.startswith(":memory:"):
            raise StoreError(
                "--db ':memory:' is not a file name; for an in-memory store (nothing kept "
                "after exit) say duckdb:///:memory:"
            )
        _refuse_missing_folder(text)
        path = Path(text).expanduser().resolve()
        return Target("file", f"duckdb:///{path}", "duckdb", path)
    url = parse_url(text)
    backend = url.get_backend_name()
    if backend not in FILE_BACKENDS:
        return Target("server", text, backend)
    database = url.database or ""
    if database in ("", ":memory:") or (backend == "duckdb" and database.startswith(":memory:")):
        return Target("memory", text, backend)
    _refuse_missing_folder(database)
    return Target("file", text, backend, Path(database).expanduser())


def _refuse_missing_folder(text: str) -> None:
    """`newdir/` names a folder: never a file named `newdir`."""
    if text.endswith(("/", os.sep)) and not Path(text).expanduser().is_dir():
        raise StoreError(
            f"cannot open database {text[:200]}: it names a folder that does not exist; give a "
            "file path (say runs.duckdb) or a server URL; nothing was created"
        )


def check_file(path: Path, backend: str, may_create_folder: bool) -> None:
    """Refuse a file target that is not a database, in one line; reads at most 16 bytes, never
    opens a FIFO or device, writes nothing."""
    try:
        st = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:  # a path through a file, a name too long, no permission
        raise StoreError(f"cannot open database {str(path)[:200]}: {exc.strerror or exc}") from None
    if st is not None and not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
        what = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        raise StoreError(
            f"cannot open database {path}: it is {what}, not a file; give a DuckDB file or a "
            "server URL"
        )
    if backend == "sqlite":
        _check_sqlite(path, st is not None)
    else:
        check_duckdb_path(path)
    if st is None:
        if path.suffix.lower() not in DB_SUFFIXES:
            raise StoreError(
                f"cannot open database {path}: a new database file is named .duckdb (or .db, "
                f".sqlite, or no suffix), not {path.suffix[:40]}; nothing was written"
            )
        parent = path.parent
        if not parent.is_dir() and (parent.exists() or not may_create_folder):
            raise StoreError(
                f"cannot open database {path}: the folder {parent} does not exist; create it "
                "first (only the default data folder is created); nothing was written"
            )


def _check_sqlite(path: Path, exists: bool) -> None:
    if path.is_dir():
        raise StoreError(f"cannot open database {path}: it is a folder; give a SQLite file")
    if not exists:
        if path.suffix.lower() in DATA_SUFFIXES:
            raise StoreError(
                f"cannot open database {path}: a {path.suffix} name is a data file, not a "
                "database; give a SQLite file (say runs.sqlite); nothing was written"
            )
        return
    try:
        with path.open("rb") as stream:
            head = stream.read(HEADER_BYTES)
    except OSError as exc:
        raise StoreError(f"cannot read database {path}: {exc.strerror or exc}") from None
    if head and not head.startswith(SQLITE_MAGIC):
        raise StoreCorruptError(
            f"{path} is not a SQLite database file (a {_kind(path, head)}); give a SQLite file, "
            "a new path or a server URL"
        )


def parse_url(text: str) -> URL:
    """A database URL; for a server, user and password are everything before the LAST `@` of
    the authority (percent-encoding decoded), so `p@ss` or `p#w/d?` stay the password."""
    scheme, sep, rest = text.partition("://")
    if not sep or "@" not in rest or scheme.split("+")[0].lower() in ("duckdb", "sqlite"):
        return _make(text)
    creds, _, hostpart = rest.rpartition("@")
    user, colon, password = creds.partition(":")
    url = _make(f"{scheme}://{hostpart}")
    return url.set(username=unquote(user) or None, password=unquote(password) if colon else None)


def _make(text: str) -> URL:
    try:
        return make_url(text)
    except (sa.exc.ArgumentError, ValueError):
        raise StoreError(f"not a database URL: {_scrub(text)!r}") from None


def _scrub(text: str) -> str:
    """A URL for a message: whatever lies between `://user:` and the last `@` is hidden."""
    scheme, sep, rest = text.partition("://")
    if not sep or "@" not in rest:
        return text[:200]
    creds, _, host = rest.rpartition("@")
    return f"{scheme}://{creds.partition(':')[0]}:***@{host}"[:200]


def check_duckdb_path(path: Path) -> None:
    """Refuse a DuckDB target that is not a database: a folder, an existing file of another
    kind, or a new path named like a data file. Reads at most 16 bytes; writes nothing."""
    if path.is_dir():
        raise StoreError(
            f"cannot open database {path}: it is a folder; give a DuckDB file (new or "
            "existing) or a server URL"
        )
    if path.exists():
        try:
            with path.open("rb") as stream:
                head = stream.read(HEADER_BYTES)
        except OSError as exc:
            raise StoreError(f"cannot read database {path}: {exc.strerror or exc}") from None
        if not head and path.suffix.lower() not in DATA_SUFFIXES:
            return  # an empty file made for the store (touch): DuckDB initialises it
        if head.startswith(SQLITE_MAGIC):
            raise StoreCorruptError(
                f"{path} is not a valid DuckDB database file (it is a SQLite file: open it as "
                f"sqlite:///{path}, or pass another --db)"
            )
        if head[8:12] != DUCKDB_MAGIC:
            raise StoreCorruptError(
                f"{path} is not a valid DuckDB database file (a {_kind(path, head)}); give a "
                "DuckDB file, a new path or a server URL"
            )
        return
    if path.suffix.lower() in DATA_SUFFIXES:
        raise StoreError(
            f"cannot open database {path}: a {path.suffix} name is a data file, not a database; "
            "give a DuckDB file (say runs.duckdb) or a server URL; nothing was written"
        )


def _kind(path: Path, head: bytes) -> str:
    """What a non-DuckDB file looks like, for the message."""
    if head.startswith(b"PAR1"):
        return "Parquet file"
    if head[8:12] == DUCKDB_MAGIC:
        return "DuckDB file"
    if head.startswith(b"PK\x03\x04"):
        return "zip file"
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON file"
    suffix = path.suffix.lower()
    return f"{suffix} file" if suffix else "file of another kind"
