"""Where the store lives and how it is opened: URL resolution, engine, schema check, lock errors.

DuckDB is the default because it needs no server; its file lock is per process, so opening a file
another process holds must say so plainly rather than surface a driver traceback.
"""

from __future__ import annotations

import importlib.util
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from sketchwalk.store import schema, target
from sketchwalk.store.errors import (
    SchemaVersionError,
    StoreBusyError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
)

ENV_URL = "SKETCHWALK_DB"
DEFAULT_FILENAME = "sketchwalk.duckdb"


def data_dir() -> Path:
    """The user data folder: $XDG_DATA_HOME/sketchwalk, else ~/.local/share/sketchwalk."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "sketchwalk"


def resolve_target(url: str | None = None) -> target.Target:
    """What to open, parsed once: the argument, else $SKETCHWALK_DB, else the default DuckDB
    file. A bare filesystem path (no `://`) is a DuckDB file, so `--db runs.duckdb` works; an
    empty $SKETCHWALK_DB counts as unset, an empty argument is refused."""
    chosen = url if url is not None else (os.environ.get(ENV_URL) or None)
    if chosen is None:
        path = data_dir() / DEFAULT_FILENAME
        return target.Target("file", f"duckdb:///{path}", "duckdb", path)
    return target.parse_target(chosen)


def resolve_url(url: str | None = None) -> str:
    """The database URL `resolve_target` settles on (for the app's environment, messages)."""
    return resolve_target(url).url


def duckdb_path(url: URL) -> Path | None:
    """The file behind a DuckDB URL, or None for another database or an in-memory one."""
    if url.get_backend_name() != "duckdb" or (url.database or ":memory:").startswith(":memory:"):
        return None
    return Path(url.database).expanduser()


def utcnow() -> datetime:
    """Naive UTC timestamp: stored the same way on DuckDB and PostgreSQL, no tz library needed."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


ENV_PASSWORD = "SKETCHWALK_DB_PASSWORD"
"""A server password kept out of the URL (compose sets it), so it needs no URL encoding."""


def create_engine(where: target.Target) -> Engine:
    """An engine for a parsed target, after its file checks (store/target.py); only the default
    data folder is created. A server connection gets the lock, idle-transaction and statement
    timeouts of the settings."""
    parsed = target.parse_url(where.url)
    if parsed.get_backend_name() == "duckdb" and where.kind == "memory":
        # A plain ":memory:" is a separate database per connection (per thread in the pool);
        # a named one is shared by every connection of this process, like a file.
        parsed = parsed.set(database=f":memory:sketchwalk_{uuid.uuid4().hex}")
    parsed = with_driver(parsed)
    server = parsed.get_backend_name() == "postgresql"
    if server and not parsed.password and os.environ.get(ENV_PASSWORD):
        parsed = parsed.set(password=os.environ[ENV_PASSWORD])
    path = where.path
    if path is not None:
        default_folder = path.parent == data_dir()
        target.check_file(path, where.backend, may_create_folder=default_folder)
        if default_folder:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"cannot create the folder for database {path}: {exc.strerror or exc}"
                ) from None
    # A server may restart or drop idle connections under a long-lived worker: check each
    # pooled connection before use instead of failing the next job.
    options: dict = {"pool_pre_ping": True} if server else {}
    if parsed.get_backend_name() == "duckdb":
        # Opening a foreign file (SQLite, say) must not make DuckDB download an extension.
        options["connect_args"] = {
            "config": {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
        }
    try:
        engine = sa.create_engine(parsed, **options)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError, ImportError) as exc:
        where = parsed.render_as_string(hide_password=True)
        raise StoreError(f"cannot use database URL {where!r}: {scrub(str(exc), parsed)}") from None
    if server:
        sa.event.listen(engine, "connect", _bounded_waits)
    return engine


def _bounded_waits(dbapi_conn: object, record: object) -> None:
    """Every server session waits at most SKETCHWALK_DB_LOCK_TIMEOUT_S for a lock, and the
    server ends a session idle inside a transaction for SKETCHWALK_DB_IDLE_TX_S or a statement
    running longer than SKETCHWALK_DB_STATEMENT_S. (A session waiting for COPY data gets
    neither: a frozen worker's save is ended by the recovery of its job, store/jobs.py.)"""
    from sketchwalk.settings import load

    s = load()
    cursor = dbapi_conn.cursor()  # type: ignore[attr-defined]
    try:
        for name, seconds in (
            ("lock_timeout", s.db_lock_timeout_s),
            ("idle_in_transaction_session_timeout", s.db_idle_tx_s),
            ("statement_timeout", s.db_statement_s),
        ):
            cursor.execute(f"SET {name} = {max(1, int(seconds * 1000))}")
    finally:
        cursor.close()
    dbapi_conn.commit()  # type: ignore[attr-defined]


def scrub(text: str, url: URL) -> str:
    """`text` without the URL's password (drivers may echo parts of a connection string)."""
    if url.password:
        text = text.replace(str(url.password), "***")
    return text


def with_driver(url: URL) -> URL:
    """`postgresql://` means psycopg 3 (the `cluster` extra) when it is installed.

    SQLAlchemy maps a bare `postgresql://` to psycopg2, which we do not depend on; users should
    not have to know the `+psycopg` suffix. An explicit driver (`postgresql+psycopg2://`) is kept.
    """
    if url.drivername == "postgresql" and importlib.util.find_spec("psycopg") is not None:
        return url.set(drivername="postgresql+psycopg")
    return url


_LOCK_PID = re.compile(r"\(PID (\d+)\)")


def translate_error(exc: BaseException, url: URL) -> StoreError | None:
    """Map a driver error to a one-line store error, or None when it is something else."""
    message = str(getattr(exc, "orig", None) or exc)
    where = duckdb_path(url) or url.render_as_string(hide_password=True)
    if "Could not set lock on file" in message or "Conflicting lock" in message:
        pid = _LOCK_PID.search(message)
        holder = f" (PID {pid.group(1)})" if pid else ""
        return StoreLockedError(
            f"database file {where} is open in another process{holder}; DuckDB allows one "
            "process at a time: close that sketchwalk app/CLI, or pass another --db / SKETCHWALK_DB"
        )
    if "sqlite_scanner" in message:  # DuckDB recognised a SQLite file (and installs nothing)
        return StoreCorruptError(
            f"{where} is not a valid DuckDB database file (it is a SQLite file: open it as "
            f"sqlite:///{where}, or pass another --db)"
        )
    if "not a valid DuckDB database file" in message or "Corrupt database" in message:
        return StoreCorruptError(
            f"{where} is not a valid DuckDB database file (damaged or another format); "
            "move it away or pass another --db"
        )
    state = getattr(getattr(exc, "orig", None), "sqlstate", None)
    if state == "55P03":  # lock_not_available: SKETCHWALK_DB_LOCK_TIMEOUT_S ran out
        return StoreBusyError(
            f"database {where} is busy: a row this needs stayed locked by another process (a "
            "worker mid-save?) past SKETCHWALK_DB_LOCK_TIMEOUT_S; nothing was changed, try again"
        )
    if state == "57014":  # query_canceled: SKETCHWALK_DB_STATEMENT_S ran out
        return StoreBusyError(
            f"database {where}: a statement ran past SKETCHWALK_DB_STATEMENT_S and was "
            "cancelled; nothing was changed"
        )
    return None


@contextmanager
def translating(url: URL, opening: bool = False) -> Iterator[None]:
    """Re-raise driver errors that have a clear meaning (lock, corrupt file) as StoreErrors.

    While opening, any other driver error (no permission, server unreachable) is also turned
    into a one-line StoreError: there is nothing of ours to debug yet, only a setting to fix.
    """
    try:
        yield
    except sa.exc.DBAPIError as exc:
        mapped = translate_error(exc, url)
        if mapped is None and opening:
            first = (str(exc.orig or exc).strip().splitlines() or [type(exc).__name__])[0]
            first = scrub(first, url)
            where = duckdb_path(url) or url.render_as_string(hide_password=True)
            mapped = StoreError(f"cannot open database {where}: {first}")
        if mapped is None:
            raise
        raise mapped from None


SCHEMA_LOCK_KEY = 0x5357_4B57  # "SWKW": the advisory lock that serializes schema changes


def lock_schema(conn: Connection) -> None:
    """On PostgreSQL, hold a transaction-level advisory lock while the schema is checked and
    created or upgraded: several workers starting at once against an empty database would
    otherwise race to CREATE TABLE (and one fails on a duplicate type). Embedded databases have
    a single process and need nothing."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})


def ensure_schema(engine: Engine) -> None:
    """Create the tables in an empty database, or check the version of an existing store and
    bring an older one forward, all in one transaction (serialized across processes).

    A database with tables but no sketchwalk meta row is someone else's: refuse to touch it.
    """
    with engine.begin() as conn:
        lock_schema(conn)
        existing = set(sa.inspect(conn).get_table_names())
        if schema.meta.name not in existing:
            if existing:
                raise StoreCorruptError(
                    f"{_where(engine)} holds other tables ({', '.join(sorted(existing)[:5])}) "
                    "and is not a sketchwalk store; pass another --db"
                )
            schema.metadata.create_all(conn)
            conn.execute(
                schema.meta.insert(),
                [
                    {"key": "app", "value": schema.STORE_MARKER},
                    {"key": "schema_version", "value": str(schema.SCHEMA_VERSION)},
                    {"key": "created_at", "value": utcnow().isoformat()},
                ],
            )
            return
        rows = dict(conn.execute(sa.select(schema.meta.c.key, schema.meta.c.value)).all())
        if rows.get("app") != schema.STORE_MARKER or "schema_version" not in rows:
            raise StoreCorruptError(
                f"{_where(engine)} is not a sketchwalk store; pass another --db"
            )
        try:
            found = int(rows["schema_version"])
        except ValueError:
            raise StoreCorruptError(
                f"{_where(engine)} has schema version {rows['schema_version'][:20]!r}, not a "
                "number; the store is damaged"
            ) from None
        if found < schema.SCHEMA_VERSION and all(
            v in schema.UPGRADES for v in range(found, schema.SCHEMA_VERSION)
        ):
            upgrade(conn, found)
            found = schema.SCHEMA_VERSION
    check_version(found, what=f"store {_where(engine)}")


def upgrade(conn: Connection, found: int) -> None:
    """Bring an older store forward by creating the tables added since (caller's transaction)."""
    for version in range(found, schema.SCHEMA_VERSION):
        for item in schema.UPGRADES[version]:
            if isinstance(item, sa.Table):
                item.create(conn, checkfirst=True)
            else:
                add_column(conn, item)
    conn.execute(
        schema.meta.update()
        .where(schema.meta.c.key == "schema_version")
        .values(value=str(schema.SCHEMA_VERSION))
    )


def add_column(conn: Connection, column: sa.Column) -> None:
    """ALTER TABLE ... ADD COLUMN (nullable, no default), unless an earlier try added it."""
    table = column.table
    if conn.dialect.name in ("duckdb", "postgresql"):  # duckdb-engine's inspector needs pg_catalog
        present = conn.execute(
            sa.text(
                "SELECT count(*) FROM information_schema.columns WHERE table_name = :t "
                "AND column_name = :c AND table_schema = current_schema()"
            ),
            {"t": table.name, "c": column.name},
        ).scalar()
    else:
        present = column.name in {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
    if present:
        return
    spec = sa.schema.CreateColumn(column).compile(dialect=conn.dialect)
    quoted = conn.dialect.identifier_preparer.quote(table.name)
    conn.execute(sa.text(f"ALTER TABLE {quoted} ADD COLUMN {spec}"))


def db_utcnow(conn: Connection) -> datetime:
    """The database's clock as naive UTC: every worker's heartbeat and every staleness cutoff
    is measured on one clock, so a worker whose clock is off cannot look dead or alive wrongly.
    Embedded databases live in this process, whose clock is theirs."""
    if conn.dialect.name == "postgresql":
        return conn.execute(sa.text("SELECT (now() AT TIME ZONE 'utc')")).scalar()
    return utcnow()


def db_clock(conn: Connection) -> datetime:
    """The database's clock now, as naive UTC: on PostgreSQL `clock_timestamp()`, not `now()`
    (the transaction's start), so the last statement of a long save stamps its commit time."""
    if conn.dialect.name == "postgresql":
        return conn.execute(sa.text("SELECT (clock_timestamp() AT TIME ZONE 'utc')")).scalar()
    return utcnow()


def check_version(found: int, what: str) -> None:
    """Refuse data written with another schema version, saying which side is newer."""
    if found == schema.SCHEMA_VERSION:
        return
    if found > schema.SCHEMA_VERSION:
        hint = "upgrade sketchwalk to read it"
        age = "newer"
    else:
        hint = "export it with the sketchwalk version that wrote it, or use a new --db"
        age = "older"
    raise SchemaVersionError(
        f"{what} has schema version {found}, {age} than this sketchwalk's "
        f"{schema.SCHEMA_VERSION}; {hint}"
    )


def _where(engine: Engine) -> str:
    path = duckdb_path(engine.url)
    return str(path) if path else engine.url.render_as_string(hide_password=True)
