"""A real PostgreSQL for tests: one throwaway schema per test on the server CI starts.

`.ci/postgres.sh` starts the server and prints `export SKETCHWALK_TEST_PG_URL=...`. Each test
gets its own schema (selected through the connection's search_path), dropped afterwards, so
tests never see each other's tables and no database has to be created per test.
In CI (CI set) a missing URL or server is an error, never a silent skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

PG_ENV = "SKETCHWALK_TEST_PG_URL"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def pg_base_url() -> str | None:
    return os.environ.get(PG_ENV) or None


def pg_enabled() -> bool:
    """Whether PostgreSQL variants of the store tests are collected (always in CI)."""
    return pg_base_url() is not None or in_ci()


def require_pg_url() -> str:
    """The server URL, or fail (CI) / skip (local run without a server) with how to get one."""
    url = pg_base_url()
    if url is None:
        msg = f'{PG_ENV} is not set; start a server with: eval "$(.ci/postgres.sh)"'
        if in_ci():
            pytest.fail(f"CI needs PostgreSQL for these tests: {msg}", pytrace=False)
        pytest.skip(msg)
    return url


def _admin_engine(url: str) -> sa.Engine:
    from sketchwalk.store.db import with_driver

    return sa.create_engine(with_driver(make_url(url)), poolclass=sa.pool.NullPool)


@contextmanager
def fresh_schema(url: str | None = None) -> Iterator[str]:
    """A URL whose connections live in a new, empty schema; the schema is dropped on exit."""
    base = url or require_pg_url()
    name = f"sw_test_{uuid.uuid4().hex[:12]}"
    admin = _admin_engine(base)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    except sa.exc.OperationalError as exc:
        admin.dispose()
        pytest.fail(f"PostgreSQL at {base} is not reachable: {exc.orig}", pytrace=False)
    scoped = make_url(base).update_query_dict({"options": f"-csearch_path={name}"})
    try:
        yield scoped.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
        admin.dispose()
