"""Opening a store: where it lives, the schema version check, locked, corrupt and foreign files."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import duckdb
import pytest
import sqlalchemy as sa

from sketchwalk.store import (
    SCHEMA_VERSION,
    SchemaVersionError,
    StoreCorruptError,
    open_store,
    resolve_url,
)
from sketchwalk.store import schema as sch


def test_default_store_lives_in_the_user_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    with open_store() as store:
        assert store.path == tmp_path / "data" / "sketchwalk" / "sketchwalk.duckdb"
        store.create_run({"prompt": "hi"})
    assert store.path.is_file()


def test_env_url_and_argument_take_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_DB", f"duckdb:///{tmp_path}/env.duckdb")
    assert resolve_url() == f"duckdb:///{tmp_path}/env.duckdb"
    assert resolve_url("duckdb:///:memory:") == "duckdb:///:memory:"
    # a bare path is a DuckDB file, in a folder that exists (only the default one is created)
    (tmp_path / "deep" / "dir").mkdir(parents=True)
    with open_store(str(tmp_path / "deep" / "dir" / "x.duckdb")) as store:
        assert store.path == tmp_path / "deep" / "dir" / "x.duckdb"
    assert (tmp_path / "deep" / "dir" / "x.duckdb").is_file()


def test_reopen_keeps_runs(db_path):
    with open_store(str(db_path)) as store:
        run_id = store.create_run({"prompt": "hi"})
    with open_store(str(db_path)) as store:
        assert store.get_run(run_id)["prompt"] == "hi"


def _set_version(db_path, version: int) -> None:
    con = duckdb.connect(str(db_path))
    con.execute("UPDATE sketchwalk_meta SET value = ? WHERE key = 'schema_version'", [str(version)])
    con.close()


@pytest.mark.parametrize(("version", "word"), [(SCHEMA_VERSION + 1, "newer"), (0, "older")])
def test_schema_version_mismatch_is_refused(db_path, version, word):
    open_store(str(db_path)).close()
    _set_version(db_path, version)
    with pytest.raises(SchemaVersionError, match=f"schema version {version}, {word}") as info:
        open_store(str(db_path))
    assert str(db_path) in str(info.value) and "\n" not in str(info.value)
    # the file can be opened again right away (the failed open released it)
    _set_version(db_path, SCHEMA_VERSION)
    open_store(str(db_path)).close()


def test_corrupt_file_is_refused_and_left_alone(tmp_path):
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreCorruptError, match="not a valid DuckDB database file") as info:
        open_store(str(bad))
    assert str(bad) in str(info.value)
    assert bad.read_bytes() == b"this is not a database" * 100


def test_foreign_duckdb_file_is_refused_and_left_alone(tmp_path):
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE customers (id INTEGER, name VARCHAR)")
    con.close()
    with pytest.raises(StoreCorruptError, match="customers.*not a sketchwalk store"):
        open_store(str(other))
    con = duckdb.connect(str(other))
    tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    con.close()
    assert tables == {"customers"}


def test_meta_table_of_someone_else_is_refused(tmp_path):
    url = f"duckdb:///{tmp_path}/m.duckdb"
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        sch.meta.create(conn)
        conn.execute(sch.meta.insert().values(key="app", value="not-us"))
    engine.dispose()
    with pytest.raises(StoreCorruptError, match="not a sketchwalk store"):
        open_store(url)


LOCK_PROBE = textwrap.dedent(
    """
    import sys
    from sketchwalk.store import open_store, StoreLockedError
    try:
        open_store(sys.argv[1]).close()
    except StoreLockedError as exc:
        print("LOCKED", exc)
        sys.exit(3)
    print("OPENED")
    """
)


@pytest.mark.heavy
def test_second_process_gets_a_clear_lock_error(db_path):
    with open_store(str(db_path)):
        probe = subprocess.run(
            [sys.executable, "-c", LOCK_PROBE, str(db_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode == 3, probe.stdout + probe.stderr
        assert str(db_path) in probe.stdout
        assert "another process" in probe.stdout and "--db" in probe.stdout

        cli = subprocess.run(
            [sys.executable, "-m", "sketchwalk.cli.main", "runs", "--db", str(db_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 2
        assert cli.stderr.count("\n") == 1 and "Traceback" not in cli.stderr
        assert "open in another process" in cli.stderr
    # closed: the other process may open it now
    probe = subprocess.run(
        [sys.executable, "-c", LOCK_PROBE, str(db_path)], capture_output=True, text=True, timeout=60
    )
    assert probe.returncode == 0 and "OPENED" in probe.stdout


def test_bad_url_is_a_clear_error():
    from sketchwalk.store import StoreError

    with pytest.raises(StoreError, match="nosuchdb"):
        open_store("nosuchdb://x/y")


def test_in_memory_store_is_shared_by_threads():
    import threading

    with open_store("duckdb:///:memory:") as store:
        assert store.path is None
        run_id = store.create_run({"prompt": "hi"})
        seen = []
        thread = threading.Thread(target=lambda: seen.append(store.get_run(run_id)["prompt"]))
        thread.start()
        thread.join()
        assert seen == ["hi"]
    with open_store("duckdb:///:memory:") as fresh:  # each open is its own database
        assert fresh.list_runs().empty


def test_unopenable_file_is_a_one_line_error(tmp_path):
    from sketchwalk.store import StoreError

    folder = tmp_path / "is_a_dir.duckdb"
    folder.mkdir()  # a folder where the database file should be
    with pytest.raises(StoreError, match="cannot open database .*is_a_dir.duckdb") as info:
        open_store(str(folder))
    assert "\n" not in str(info.value)
