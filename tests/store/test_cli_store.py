"""`sketchwalk runs / export / import / delete` through the CLI entry point."""

from __future__ import annotations

import json
import zipfile

import pytest
from store_fixtures import saved_run

from sketchwalk.cli.main import main
from sketchwalk.store import open_store


@pytest.fixture
def two_runs(db_path):
    with open_store(str(db_path)) as store:
        a, _ = saved_run(store)
        b, _ = saved_run(store, seed=1)
        store.mark_failed(b, "boom")
        store.create_run({"prompt": "waiting"})  # no token count yet
    return a, b


def test_runs_table_and_json(db_path, two_runs, capsys):
    a, b = two_runs
    assert main(["runs", "--db", str(db_path)]) == 0
    out = capsys.readouterr().out
    assert a in out and b in out and "failed" in out and "done" in out and "queued" in out
    assert main(["runs", "--db", str(db_path), "--status", "failed", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == [b] and rows[0]["error"] == "boom"


def test_runs_uses_env_db(db_path, two_runs, capsys, monkeypatch):
    monkeypatch.setenv("SKETCHWALK_DB", f"duckdb:///{db_path}")
    assert main(["runs", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3


def test_export_import_delete(db_path, two_runs, tmp_path, capsys):
    a, b = two_runs
    out = tmp_path / "exp"
    assert main(["export", a, "--out", str(out), "--db", str(db_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[-1].endswith("manifest.json") and len(printed) == 6
    assert json.loads((out / "manifest.json").read_text())["run_ids"] == [a]

    assert main(["export", "--all", "--out", str(out), "--zip", "--db", str(db_path)]) == 0
    zip_path = out / "sketchwalk-export.zip"
    assert capsys.readouterr().out.strip() == str(zip_path)
    assert "manifest.json" in zipfile.ZipFile(zip_path).namelist()

    other = tmp_path / "other.duckdb"
    assert main(["import", str(zip_path), "--db", str(other), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 3
    assert main(["import", str(zip_path), "--db", str(other)]) == 2
    assert "already in the store" in capsys.readouterr().err

    assert main(["delete", a, "--db", str(other)]) == 0
    capsys.readouterr()
    with open_store(str(other)) as store:
        assert a not in set(store.list_runs()["id"]) and len(store.list_runs()) == 2


def test_cli_errors_are_one_line(db_path, two_runs, tmp_path, capsys):
    a, _ = two_runs
    assert main(["delete", a, "nope", "--db", str(db_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sketchwalk: error: no run with id 'nope'") and err.count("\n") == 1
    with open_store(str(db_path)) as store:
        assert len(store.list_runs()) == 3  # nothing deleted on a typo
    assert main(["export", "--out", str(tmp_path / "x"), "--db", str(db_path)]) == 2
    assert "--all" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "missing"), "--db", str(db_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
