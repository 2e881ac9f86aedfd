"""Errors the store raises: each a one-line `SketchWalkError` a user can act on.

Separate classes let the app and CLI react to a situation (a locked file, a missing run) without
parsing messages, while `sketchwalk.cli.main` prints any of them as one line.
"""

from __future__ import annotations

from sketchwalk.errors import SketchWalkError


class StoreError(SketchWalkError):
    """Base class of every store error."""


class StoreLockedError(StoreError):
    """A DuckDB file is held open for writing by another process (DuckDB locks per process)."""


class StoreBusyError(StoreError):
    """A server database kept a lock or a statement past its timeout (another process holds
    the row, or was frozen holding it); nothing was changed."""


class StoreCorruptError(StoreError):
    """The database is not a sketchwalk store: not a DuckDB file, damaged, or someone else's."""


class SchemaVersionError(StoreError):
    """The store (or an export) was written with a different schema version than this code uses."""


class UnknownRunError(StoreError, KeyError):
    """No run with that id in this store."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownJobError(StoreError, KeyError):
    """No job with that id in this store."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RunExistsError(StoreError):
    """An import would overwrite runs that are already in the store."""


class InvalidResultError(StoreError):
    """A RunResult (or a request) does not have the shapes the store expects."""


class ExportError(StoreError):
    """An export could not be written (folder missing rights, disk full)."""


class ForeignExportError(StoreError):
    """A file given to import is not a sketchwalk export (or is damaged)."""


class JobLostError(StoreError):
    """A worker wrote to a job it no longer owns (recovered after a pause, or re-queued): the
    write was refused and rolled back, so a revived worker never overwrites the job's fate."""


class SaveError(StoreError):
    """A result could not be saved (disk full, database gone); the transaction rolled back."""
