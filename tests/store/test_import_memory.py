"""Peak memory of `sketchwalk import` for each bomb shape of issue 50 (tests/import_bombs.py),
measured in a child process: at most 1 GiB whatever the upload, where the import used to read
each zip member whole and materialise every table (2.7 to 4.5 GB for these shapes)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from import_bombs import ROWS, build
from store_fixtures import saved_run

from sketchwalk.store import open_store

BOUND_MIB = 1024


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    work = tmp_path_factory.mktemp("bombs")
    with open_store(str(work / "src.duckdb")) as src:
        run_id, _ = saved_run(src)
        src.export_parquet([run_id], work / "export")
    return work / "export"


def _import_peak(db, source) -> tuple[subprocess.CompletedProcess, int]:
    """`sketchwalk import` in a child process, and that child's peak resident memory (MiB).
    A fresh interpreter per shape, so RUSAGE_CHILDREN holds only this child's peak."""
    probe = (
        "import resource, subprocess, sys\n"
        "out = subprocess.run([sys.executable, '-m', 'sketchwalk.cli.main', 'import', '--db', "
        "sys.argv[1], sys.argv[2]], capture_output=True, text=True)\n"
        "print(out.returncode)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
        "sys.stdout.write(out.stderr)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe, str(db), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    code, peak, *said = run.stdout.splitlines()
    run.returncode, run.stderr = int(code), "\n".join(said)
    return run, int(peak)


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("shape", "imports"), [("near-cap", True), ("padded", True), ("inflation", False)]
)
def test_import_peak_memory_per_bomb_shape(tmp_path, export_dir, shape, imports):
    bomb = build(shape, export_dir, tmp_path)
    assert bomb.stat().st_size < 32 << 20  # small on disk, large inflated or decoded
    db = tmp_path / "dst.duckdb"
    out, peak = _import_peak(db, bomb)
    print(f"{shape}: {bomb.stat().st_size / (1 << 20):.1f} MB zip, peak {peak} MiB")
    assert peak <= BOUND_MIB, (shape, peak)
    if imports:
        assert out.returncode == 0, out.stderr
        with open_store(str(db)) as store:
            (run_id,) = store.run_ids()
            assert store_tokens(store, run_id) == ROWS[shape]  # every row of the bomb stored
    else:
        assert out.returncode == 2 and out.stderr.count("\n") == 0, out.stderr
        assert "decodes to over 1024 MiB" in out.stderr
        with open_store(str(db)) as store:
            assert store.run_ids() == []  # nothing of it stayed


@pytest.mark.heavy
@pytest.mark.parametrize(("shape", "imports"), [("near-cap-run", False), ("at-limit-run", True)])
def test_import_peak_memory_of_a_long_runs_row(tmp_path, export_dir, shape, imports):
    """A runs row past the store's text limits is refused before it is decoded; one at them
    imports, within the bound either way."""
    bomb = build(shape, export_dir, tmp_path)
    db = tmp_path / "dst.duckdb"
    out, peak = _import_peak(db, bomb)
    print(f"{shape}: {bomb.stat().st_size / (1 << 20):.1f} MB zip, peak {peak} MiB")
    assert peak <= BOUND_MIB, (shape, peak)
    with open_store(str(db)) as store:
        stored = store.run_ids()
    if imports:
        assert out.returncode == 0, out.stderr
        assert len(stored) == 1
    else:
        assert out.returncode == 2 and out.stderr.count("\n") == 0, out.stderr
        assert "longer than 2097152 characters, the store's limit" in out.stderr
        assert stored == []


def store_tokens(store, run_id: str) -> int:
    """Token rows stored for the run, counted by the database."""
    import sqlalchemy as sa

    from sketchwalk.store import schema

    with store.engine.connect() as conn:
        return conn.execute(
            sa.select(sa.func.count()).where(schema.tokens.c.run_id == run_id)
        ).scalar()


def test_duckdb_settings_are_put_back_after_an_import(tmp_path, export_dir):
    """The import runs DuckDB on one thread under a small memory limit; after it (imported or
    refused), the store's own settings are back."""
    import shutil

    def settings(store) -> tuple:
        with store.engine.connect() as conn:
            return tuple(
                conn.exec_driver_sql(f"SELECT current_setting('{name}')").scalar()
                for name in ("threads", "memory_limit")
            )

    broken = tmp_path / "broken"
    shutil.copytree(export_dir, broken)
    (broken / "tokens.parquet").write_bytes(b"PAR1 not parquet PAR1")
    with open_store(str(tmp_path / "s.duckdb")) as store:
        before = settings(store)
        with pytest.raises(Exception, match="not a readable Parquet file"):
            store.import_parquet(broken)  # refused after runs.parquet went in: rolled back
        assert settings(store) == before and store.run_ids() == []
        store.import_parquet(export_dir)
        assert settings(store) == before and len(store.run_ids()) == 1
