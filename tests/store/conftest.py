"""Fixtures for store tests: a fresh store per test.

Every test gets its own database file under tmp_path, and XDG_DATA_HOME / SKETCHWALK_DB point into
tmp_path too, so no test can touch a user's real store.
"""

from __future__ import annotations

import pytest
from pg_testdb import fresh_schema, pg_enabled

from sketchwalk.store import open_store

BACKENDS = ["duckdb", "sqlite"] + (["postgresql"] if pg_enabled() else [])


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SKETCHWALK_DB", raising=False)


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "store.duckdb"


@pytest.fixture(params=BACKENDS)
def store(request, db_path, tmp_path):
    """A fresh store. DuckDB is the default backend (columnar fast path); SQLite runs the
    generic SQLAlchemy path; PostgreSQL (a real server, when SKETCHWALK_TEST_PG_URL is set, and
    always in CI) is the multi-worker backend, in a throwaway schema per test."""
    if request.param == "postgresql":
        with fresh_schema() as url, open_store(url) as s:
            yield s
        return
    url = str(db_path) if request.param == "duckdb" else f"sqlite:///{tmp_path}/store.sqlite"
    with open_store(url) as s:
        yield s
