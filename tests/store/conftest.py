"""Fixtures for store tests: a fresh store per test.

Every test gets its own database file under tmp_path, and XDG_DATA_HOME / SKETCHWALK_DB point into
tmp_path too, so no test can touch a user's real store.
"""

from __future__ import annotations

import pytest

from sketchwalk.store import open_store


@pytest.fixture(autouse=True)
def _isolated_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SKETCHWALK_DB", raising=False)


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "store.duckdb"


@pytest.fixture(params=["duckdb", "sqlite"])
def store(request, db_path, tmp_path):
    """A fresh store. DuckDB is the default backend (columnar fast path); SQLite runs the same
    tests through the generic SQLAlchemy path that PostgreSQL will use (no server needed)."""
    url = str(db_path) if request.param == "duckdb" else f"sqlite:///{tmp_path}/store.sqlite"
    with open_store(url) as s:
        yield s
