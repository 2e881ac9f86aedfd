"""`Store`: one open database (engine + checked schema) with the run, job and export methods.

The methods live in small mixins (run writes, reads, jobs, export, eval results); this module owns opening and closing, so
every connection goes through the same error translation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from sqlalchemy.engine import Connection, Engine

from sketchwalk.store import db
from sketchwalk.store.evals import EvalsMixin
from sketchwalk.store.export import ExportMixin
from sketchwalk.store.jobs import JobsMixin
from sketchwalk.store.reads import ReadsMixin
from sketchwalk.store.runs import RunsMixin


class Changes:
    """A count of this process's committed writes to one store, for a reader in the same process
    that would otherwise poll: `wait` returns as soon as the count moves (the app's worker thread
    storing a verdict wakes the page that waits for it). Other processes' writes do not move it."""

    def __init__(self) -> None:
        self._moved = threading.Condition()
        self.count = 0

    def bump(self) -> None:
        with self._moved:
            self.count += 1
            self._moved.notify_all()

    def wait(self, seen: int, timeout_s: float) -> int:
        """The count once it differs from `seen`, or after `timeout_s` (then possibly `seen`)."""
        with self._moved:
            self._moved.wait_for(lambda: self.count != seen, timeout_s)
            return self.count


class Store(RunsMixin, ReadsMixin, JobsMixin, ExportMixin, EvalsMixin):
    """An open sketchwalk store. Thread-safe to share within one process; close when done.

    On DuckDB the file stays locked to this process until `close()` (DuckDB's rule), so the app
    keeps one Store for its lifetime and CLI commands open one per invocation.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.url = engine.url.render_as_string(hide_password=True)
        self.changes = Changes()

    @property
    def path(self) -> Path | None:
        """The DuckDB file, or None for a server database / in-memory store."""
        return db.duckdb_path(self.engine.url)

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        with db.translating(self.engine.url), self.engine.begin() as conn:
            yield conn
        self.changes.bump()  # committed (a failed write raised above)

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        with db.translating(self.engine.url), self.engine.connect() as conn:
            yield conn

    def close(self) -> None:
        """Release every connection (and with it the DuckDB file lock)."""
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self.url!r})"


def open_store(url: str | None = None) -> Store:
    """Open (creating on first use) the store at `url`, $SKETCHWALK_DB, or the default file.

    Raises StoreLockedError when another process holds the DuckDB file, StoreCorruptError for a
    damaged or foreign database, SchemaVersionError for a store of another schema version.
    """
    where = db.resolve_target(url)
    engine = db.create_engine(where)
    new_file = where.path is not None and not where.path.exists()
    try:
        with db.translating(engine.url, opening=True):
            db.ensure_schema(engine)
    except BaseException:
        engine.dispose()
        if new_file:
            _remove_if_empty(where.path)
        raise
    return Store(engine)


def _remove_if_empty(path: Path) -> None:
    """A database file this open created and left empty (a full disk): nothing stays behind.
    A file with bytes in it may be another process's store and is never touched."""
    for leftover in (path, path.with_name(path.name + ".wal")):
        try:
            if leftover.is_file() and leftover.stat().st_size == 0:
                leftover.unlink()
        except OSError:
            pass
