"""`--db` parsed once into a typed target: every spelling that names no database is refused in
one line, exit 2, with nothing created; file, server and in-memory targets still open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sketchwalk.cli.main import main
from sketchwalk.store import open_store
from sketchwalk.store.db import resolve_target
from sketchwalk.store.errors import StoreError

# spelling -> words of its one line; run from an empty folder holding `adir/`, `fifo`, `some.json`
REFUSED = {
    "some.json%00": "holds a NUL byte",
    "x%00.duckdb": "holds a NUL byte",
    "x\x00.duckdb": "holds a NUL byte",
    "duckdb:///x%00.duckdb": "holds a NUL byte",
    "sqlite:///x%00.sqlite": "holds a NUL byte",
    "newdir/": "names a folder that does not exist",
    "duckdb:///newdir/": "names a folder that does not exist",
    ":memory:": "say duckdb:///:memory:",
    ":memory:x": "say duckdb:///:memory:",
    "missing/x.duckdb": "the folder",
    "duckdb:///missing/x.duckdb": "the folder",
    "sqlite:///missing/x.sqlite": "the folder",
    "adir": "it is a folder",
    "adir/": "it is a folder",
    "sqlite:///adir": "it is a folder",
    "fifo": "it is a FIFO",
    "sqlite:///fifo": "it is a FIFO",
    "/dev/null": "a device or socket",
    "new.json": "a .json name is a data file",
    "duckdb:///new.json": "a .json name is a data file",
    "sqlite:///new.json": "a .json name is a data file",
    "new.parquet": "a .parquet name is a data file",
    "x.weird": "a new database file is named .duckdb",
    "some.json": "not a valid DuckDB database file (a JSON file)",
    "sqlite:///some.json": "not a SQLite database file (a JSON file)",
    "": "--db is empty",
    "   ": "--db is empty",
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SKETCHWALK_DB", raising=False)
    (tmp_path / "adir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "some.json").write_text('{"runs": []}\n')
    return tmp_path


def _tree(root: Path) -> dict[str, bytes | None]:
    return {
        str(p): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
        if not p.is_fifo()
    }


@pytest.mark.parametrize("spelling", sorted(REFUSED))
def test_a_db_naming_no_database_is_refused_in_one_line(workdir, capsys, spelling):
    before = _tree(workdir)
    assert main(["runs", "--db", spelling]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sketchwalk: error: "), err
    assert REFUSED[spelling] in err
    assert "\x00" not in err
    assert _tree(workdir) == before  # nothing created, nothing changed
    with pytest.raises(StoreError):  # the same refusal through the API
        open_store(spelling)
    assert _tree(workdir) == before


@pytest.mark.parametrize(
    ("spelling", "kind"),
    [
        ("duckdb:///:memory:", "memory"),
        ("sqlite://", "memory"),
        ("sqlite:///:memory:", "memory"),
        ("ok.duckdb", "file"),
        ("noext", "file"),
        ("adir/inside.db", "file"),
        ("sqlite:///s.sqlite", "file"),
        ("postgresql://u:p@h:5432/d", "server"),
    ],
)
def test_database_targets_parse_to_their_kind(workdir, spelling, kind):
    assert resolve_target(spelling).kind == kind


@pytest.mark.parametrize(
    "spelling",
    ["duckdb:///:memory:", "sqlite://", "ok.duckdb", "adir/inside.db", "sqlite:///s.sqlite"],
)
def test_database_targets_open(workdir, spelling):
    with open_store(spelling) as store:
        run_id = store.create_run({"prompt": "kept"})
        assert store.get_run(run_id)["prompt"] == "kept"
    made = {p.name for p in workdir.rglob("*")} - {"adir", "fifo", "some.json", "xdg"}
    expected = {"ok.duckdb", "inside.db", "s.sqlite"} & {spelling.rsplit("/", 1)[-1]}
    assert made == expected  # a file target made its file, an in-memory one none


def test_the_default_store_folder_is_created(workdir):
    with open_store() as store:
        assert store.path == workdir / "xdg" / "sketchwalk" / "sketchwalk.duckdb"
    assert store.path.is_file()


def test_a_failed_first_open_leaves_no_empty_file(workdir, monkeypatch):
    from sketchwalk.store import db

    def full_disk(engine):
        raise StoreError("could not write: No space left on device")

    monkeypatch.setattr(db, "ensure_schema", full_disk)
    (workdir / "b.duckdb").touch()  # an empty file the user made stays: it was there before
    for name in ("a.duckdb", "b.duckdb"):
        with pytest.raises(StoreError, match="No space left"):
            open_store(name)
    assert not (workdir / "a.duckdb").exists()
    assert (workdir / "b.duckdb").exists()
