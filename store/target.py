"""What `--db` (and SKETCHWALK_DB) may name: a DuckDB file, a new path, or a server URL.

DuckDB opens almost anything it is given: a JSON or CSV file became an empty in-memory database
(a run "saved" there was lost silently), a Parquet export a 49-line traceback. So before a store
is opened (and before its folder is created) a file must be a DuckDB database, a new path must
not look like a data file, and a folder is refused; each in one line.

Server URLs are parsed here too: a password holding `@` (or `/`, `?`, `#`) is split at the
last `@`, so no part of it is ever taken for the host and shown in an error.
"""

from __future__ import annotations

from pathlib import Path
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
HEADER_BYTES = 16


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
    if head.startswith(b"PK\x03\x04"):
        return "zip file"
    if head.lstrip()[:1] in (b"{", b"["):
        return "JSON file"
    suffix = path.suffix.lower()
    return f"{suffix} file" if suffix else "file of another kind"
