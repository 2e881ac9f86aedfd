"""The run store: every run's records in DuckDB (default) or any SQLAlchemy database.

    from sketchwalk.store import open_store
    with open_store() as store:            # $SKETCHWALK_DB or ~/.local/share/sketchwalk/...
        run_id = store.create_run({"prompt": "...", "model": "...", "config": {}})
        store.save_result(run_id, result)  # one transaction
        hm = store.heatmap(run_id, "prefill", 0, layer=5)

No torch here: the store takes the engine's plain records (sketchwalk.engine.run.records).
"""

from sketchwalk.store.core import Store, open_store
from sketchwalk.store.db import ENV_URL, data_dir, resolve_url
from sketchwalk.store.errors import (
    ExportError,
    ForeignExportError,
    InvalidResultError,
    RunExistsError,
    SchemaVersionError,
    StoreBusyError,
    StoreCorruptError,
    StoreError,
    StoreLockedError,
    UnknownJobError,
    UnknownRunError,
)
from sketchwalk.store.jobs import Job
from sketchwalk.store.schema import SCHEMA_VERSION

__all__ = [
    "ENV_URL",
    "SCHEMA_VERSION",
    "ExportError",
    "ForeignExportError",
    "InvalidResultError",
    "Job",
    "RunExistsError",
    "SchemaVersionError",
    "Store",
    "StoreBusyError",
    "StoreCorruptError",
    "StoreError",
    "StoreLockedError",
    "UnknownJobError",
    "UnknownRunError",
    "data_dir",
    "open_store",
    "resolve_url",
]
