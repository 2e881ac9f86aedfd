"""The fault suite at the command line: each bad input or fault gets one line on stderr and
exit 2 (a signal: 128 + its number), and leaves the store as it was, or the run honestly
failed."""

from __future__ import annotations

import io
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from frozen_save import save_session, stopped

from sketchwalk.cli.main import main
from sketchwalk.store import open_store
from sketchwalk.store import schema as sch

PROMPT = "Sketch and walk over blocks of tokens, layer after layer. " * 6


def _one_line(capsys) -> str:
    """The error as a terminal shows it: the progress bar (redrawn with carriage returns and
    cleared when it closes) leaves nothing, the error exactly one line."""
    lines = [line.split("\r")[-1].strip() for line in capsys.readouterr().err.split("\n")]
    lines = [line for line in lines if line]
    assert len(lines) == 1, lines
    return lines[0]


def _stored(db) -> int:
    with open_store(str(db)) as store:
        return len(store.run_ids())


def _run(db, model, *extra: str) -> list[str]:
    return ["run", "--model", str(model), "--db", str(db), "--block-size", "16", *extra]


@pytest.fixture
def db(tmp_path):
    return tmp_path / "runs.duckdb"


def test_a_prompt_file_that_is_not_utf8(db, tiny_model_dir, tmp_path, capsys):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"text then \xff\xfe\x00 binary")
    assert main(_run(db, tiny_model_dir, "--prompt-file", str(binary))) == 2
    line = _one_line(capsys)
    assert "is not UTF-8 text" in line and "0xff" in line
    assert not db.exists()


def test_stdin_that_is_not_utf8(db, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\xc3\x28 broken")))
    assert main(_run(db, tiny_model_dir, "--prompt-file", "-")) == 2
    assert "stdin is not UTF-8 text" in _one_line(capsys)
    assert not db.exists()


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--device", "bogus"], "unknown device 'bogus'"),
        (["--dense-layers", "99"], "dense layers 99 do not exist"),
        (["--max-new-tokens", "-1"], "--max-new-tokens must be in 0..1048576, got -1"),
    ],
)
def test_bad_run_options_write_nothing(db, tiny_model_dir, capsys, extra, words):
    assert main(_run(db, tiny_model_dir, PROMPT, *extra)) == 2
    assert words in _one_line(capsys)
    assert not db.exists() or _stored(db) == 0


@pytest.mark.parametrize("prompt", ["nul\x00inside", "\x00"])
def test_a_nul_byte_in_a_prompt_is_refused(db, tiny_model_dir, capsys, prompt):
    assert main(_run(db, tiny_model_dir, prompt)) == 2
    assert "NUL" in _one_line(capsys) or "empty" in capsys.readouterr().err
    assert not db.exists()


def test_a_nul_byte_never_reaches_postgresql(tiny_model_dir, capsys, pg_url):
    assert main(_run(pg_url, tiny_model_dir, "before\x00after")) == 2
    assert "NUL character" in _one_line(capsys)
    with open_store(pg_url) as store:
        assert store.run_ids() == []


def test_a_corrupt_weights_file(db, tiny_model_dir, tmp_path, capsys):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    assert main(_run(db, broken, PROMPT)) == 2
    assert "cannot load model" in _one_line(capsys)
    assert not db.exists() or _stored(db) == 0


def test_a_full_disk_during_the_save(db, tiny_model_dir, capsys, monkeypatch):
    import duckdb

    from sketchwalk.store.runs import RunsMixin

    def full(self, conn, table, data, key):
        raise duckdb.IOException("could not write file: No space left on device")

    monkeypatch.setattr(RunsMixin, "_insert", full)
    assert main(_run(db, tiny_model_dir, PROMPT, "--max-new-tokens", "2")) == 2
    line = _one_line(capsys)
    assert "saving results failed" in line and "No space left on device" in line
    with open_store(str(db)) as store:
        (run_id,) = store.run_ids()
        run = store.get_run(run_id)
        assert run["status"] == "failed" and "No space left" in run["error"]
        with store.engine.connect() as conn:
            for table in sch.RUN_TABLES[1:]:
                n = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()
                assert n == 0, table.name


def test_a_full_disk_at_run_creation(db, tiny_model_dir):
    with open_store(str(db)):  # an empty store, then a disk with no room for its log
        pass
    wal = db.with_name(db.name + ".wal")
    wal.symlink_to("/dev/full")  # every write the kernel refuses: ENOSPC, no root needed
    cmd = [sys.executable, "-m", "sketchwalk.cli.main"]
    cmd += _run(db, tiny_model_dir, PROMPT, "--max-new-tokens", "2")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()  # a retry would log a line each: none, at once
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "cannot create the run" in lines[0] and "No space left on device" in lines[0]
    wal.unlink()
    assert _stored(db) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "x", "--density", "lots"],
        ["runs", "--status", "sideways"],
        ["frobnicate"],
        ["run", "x", "--no-such-flag"],
    ],
)
def test_usage_errors_are_one_line(argv, capsys):
    assert main(argv) == 2
    line = _one_line(capsys)
    assert line.startswith("sketchwalk") and "error:" in line and "--help" in line


def test_runs_limit_must_not_be_negative(db, capsys):
    assert main(["runs", "--db", str(db), "--limit", "-1"]) == 2
    assert "--limit must be 0 or more" in _one_line(capsys)


def test_control_characters_are_escaped_in_the_terminal(db, capsys):
    with open_store(str(db)) as store:
        store.create_run({"prompt": "\x1b]0;owned\x07\x1b[2J title"})
    assert main(["runs", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\\x1b" in out


def test_model_output_reaches_the_terminal_escaped(capsys):
    from sketchwalk.cli.run import print_human, summarize
    from sketchwalk.engine.run.records import RunResult

    osc = "\x1b]0;owned\x07\x1b[2J"  # retitle the terminal, clear the screen
    result = RunResult(
        model_id=f"org/model{osc}",
        model_hash=None,
        prompt="p",
        prompt_tokens=1,
        method="sketchwalk",
        config={},
        device="cpu",
        versions={},
        dense_text=f"line one\n\tindented {osc}",
        sparse_text="bell\x07 nul\x00 csi\x9b2J",
        metrics={},
        timings={},
        layers=[],
        blocks=[],
        tokens=[],
    )
    print_human(summarize(result, None))
    out = capsys.readouterr().out
    for raw in ("\x1b", "\x07", "\x00", "\x9b"):
        assert raw not in out
    assert "\\x1b]0;owned\\x07" in out and "bell\\x07 nul\\x00" in out
    assert "line one\n\tindented" in out  # a generation's own lines and tabs stay


def test_a_sqlite_file_opened_as_duckdb_is_one_line_and_installs_nothing(tmp_path, capsys):
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    assert main(["runs", "--db", str(path)]) == 2
    assert "not a valid DuckDB database file" in _one_line(capsys)
    with open_store(str(tmp_path / "ok.duckdb")) as store, store.engine.connect() as conn:
        setting = conn.exec_driver_sql(
            "SELECT current_setting('autoinstall_known_extensions')"
        ).scalar()
    assert setting is False


def test_a_store_with_a_non_integer_schema_version(db, capsys):
    with open_store(str(db)) as store, store.engine.begin() as conn:
        conn.execute(
            sch.meta.update().where(sch.meta.c.key == "schema_version").values(value="three")
        )
    assert main(["runs", "--db", str(db)]) == 2
    assert "not a number" in _one_line(capsys)


def test_runs_marks_a_dead_processes_run_failed(db, capsys):
    with open_store(str(db)) as store:
        orphan = store.create_run({"prompt": "left behind"}, status="running")
    assert main(["runs", "--db", str(db), "--json"]) == 0
    capsys.readouterr()
    with open_store(str(db)) as store:
        run = store.get_run(orphan)
    assert run["status"] == "failed" and "stopped before it finished" in run["error"]


# ---- signals during `sketchwalk run` ------------------------------------------------------


def _start_run(db_url: str, model, tmp_path) -> tuple[subprocess.Popen, object]:
    log = tmp_path / "run.log"
    cmd = [sys.executable, "-m", "sketchwalk.cli.main", *_run(db_url, model, PROMPT * 3)]
    cmd += ["--max-new-tokens", "3000"]  # long enough to be caught mid-run
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    return proc, log


def _wait_until(cond, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _runs_fails(url: str, run_id: str, monkeypatch, capsys) -> None:
    """Wait until `sketchwalk runs`, with a 0.5 s stale heartbeat, lists the run as failed."""
    monkeypatch.setenv("SKETCHWALK_RUN_STALE_S", "0.5")
    _wait_until(
        lambda: (
            main(["runs", "--db", url, "--status", "failed", "--json"]) == 0
            and run_id in capsys.readouterr().out
        ),
        "`sketchwalk runs` to fail the run",
        timeout=30,
    )


@pytest.mark.heavy
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_marks_the_run_failed_on_duckdb(db, tiny_model_dir, tmp_path, sig):
    proc, log = _start_run(str(db), tiny_model_dir, tmp_path)
    try:  # the progress bar shows once the run row exists and the model runs
        _wait_until(lambda: "%|" in log.read_text() or proc.poll() is not None, "the run")
        proc.send_signal(sig)
        rc = proc.wait(60)
    finally:
        proc.kill()
    assert rc == 128 + sig, log.read_text()
    assert log.read_text().strip().splitlines()[-1].startswith("sketchwalk: interrupted")
    with open_store(str(db)) as store:
        (run_id,) = store.run_ids()
        run = store.get_run(run_id)
    assert run["status"] == "failed"
    assert run["error"].startswith(f"interrupted ({signal.Signals(sig).name})")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_marks_the_run_failed_on_postgresql(tiny_model_dir, tmp_path, pg_url, sig):
    url = pg_url  # a fresh schema of the test server, dropped afterwards
    proc, log = _start_run(url, tiny_model_dir, tmp_path)
    try:
        with open_store(url) as store:
            _wait_until(
                lambda: store.list_runs(status="running").shape[0] == 1 or proc.poll() is not None,
                "the run",
            )
            proc.send_signal(sig)
            rc = proc.wait(60)
            (run_id,) = store.run_ids()
            run = store.get_run(run_id)
    finally:
        proc.kill()
    assert rc == 128 + sig, log.read_text()
    assert run["status"] == "failed"
    assert run["error"].startswith(f"interrupted ({signal.Signals(sig).name})")


def test_a_killed_cli_run_is_failed_by_the_next_process_on_postgresql(
    tiny_model_dir, tmp_path, pg_url, monkeypatch, capsys
):
    url = pg_url  # a fresh schema of the test server, dropped afterwards
    proc, log = _start_run(url, tiny_model_dir, tmp_path)
    try:
        with open_store(url) as store:
            _wait_until(
                lambda: store.list_runs(status="running").shape[0] == 1 or proc.poll() is not None,
                "the run",
            )
            proc.kill()  # SIGKILL: no handler runs, the heartbeat stops
            proc.wait(60)
            (run_id,) = store.run_ids()
            assert store.get_run(run_id)["status"] == "running"
            _runs_fails(url, run_id, monkeypatch, capsys)
            run = store.get_run(run_id)
    finally:
        proc.kill()
    assert run["status"] == "failed" and "no heartbeat" in run["error"]


@pytest.mark.heavy
def test_a_cli_run_frozen_inside_its_copy_is_cut_off_by_the_next_process(
    tiny_model_dir, tmp_path, pg_url, monkeypatch, capsys
):
    """A plain `sketchwalk run` stopped (SIGSTOP) while the server waits for its COPY data,
    where PostgreSQL applies no statement timeout: once its heartbeat is stale, the next
    `sketchwalk runs` fails the run and ends its server session. Nobody else reruns a plain
    run: revived, it finds its connection gone, retries the save and stores the run whole."""
    log = tmp_path / "run.log"
    cmd = [sys.executable, str(Path(__file__).parents[1] / "frozen_save.py")]
    cmd += [*_run(pg_url, tiny_model_dir, PROMPT), "--max-new-tokens", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        with open_store(pg_url) as store:
            _wait_until(lambda: stopped(proc.pid) or proc.poll() is not None, "the freeze")
            (run_id,) = store.run_ids()
            state, query = save_session(store, run_id) or ("gone", "")
            assert (state, query[:5]) == ("active", "COPY "), (state, query, log.read_text())
            _runs_fails(pg_url, run_id, monkeypatch, capsys)
            assert save_session(store, run_id) is None  # its session was ended
            assert stopped(proc.pid)  # all of that while it stayed frozen
            failed = store.get_run(run_id)
            proc.send_signal(signal.SIGCONT)
            rc = proc.wait(60)
            run = store.get_run(run_id)
            with store.engine.connect() as conn:
                counts = {
                    t.name: conn.execute(
                        sa.select(sa.func.count()).select_from(t).where(t.c.run_id == run_id)
                    ).scalar()
                    for t in (sch.layer_stats, sch.block_scores, sch.blocks, sch.tokens)
                }
    finally:
        proc.kill()
    out = log.read_text()
    assert failed["status"] == "failed" and "no heartbeat" in failed["error"]
    assert rc == 0 and "Traceback" not in out, out
    assert "the connection is lost; nothing of the run was stored); retrying" in out
    assert (run["status"], run["error"]) == ("done", None)
    assert all(counts.values()), counts  # every table of the run, written by the retry


# ---- --db names a database, or nothing is written ----------------------------------------


def _not_a_database(tmp_path, kind: str):
    """A path --db must refuse, made the way a user would end up with one."""
    if kind == "json file":
        path = tmp_path / "some.json"
        path.write_text('{"runs": []}\n')
    elif kind == "csv file":
        path = tmp_path / "runs.csv"
        path.write_text("id,prompt\n1,hello\n")
    elif kind == "parquet export":
        with open_store(str(tmp_path / "src.duckdb")) as store:
            store.create_run({"prompt": "exported"})
            store.export_parquet(None, tmp_path / "export")
        path = tmp_path / "export" / "runs.parquet"
    elif kind == "folder":
        path = tmp_path / "export"
        path.mkdir()
    else:  # a new path named like a data file
        path = tmp_path / "new" / f"fresh.{kind.split()[-1]}"
    return path


def _tree(root) -> dict:
    return {str(p): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("json file", "not a valid DuckDB database file (a JSON file)"),
        ("csv file", "not a valid DuckDB database file (a .csv file)"),
        ("parquet export", "not a valid DuckDB database file (a Parquet file)"),
        ("folder", "it is a folder"),
        ("new json", "a .json name is a data file"),
        ("new parquet", "a .parquet name is a data file"),
    ],
)
def test_db_that_is_not_a_database_is_refused_and_nothing_is_written(
    tmp_path, tiny_model_dir, capsys, kind, words
):
    path = _not_a_database(tmp_path, kind)
    before = _tree(tmp_path)
    assert main(_run(path, tiny_model_dir, PROMPT)) == 2
    assert words in _one_line(capsys)
    assert main(["runs", "--db", str(path)]) == 2
    assert words in _one_line(capsys)
    assert _tree(tmp_path) == before  # no run, no database, no folder


def test_db_accepts_a_new_path_and_an_existing_store(tmp_path, capsys):
    (tmp_path / "new").mkdir()
    fresh = tmp_path / "new" / "runs"  # no suffix: a new DuckDB file
    assert main(["runs", "--db", str(fresh)]) == 0
    assert main(["runs", "--db", str(fresh)]) == 0  # and it is a database now
    assert capsys.readouterr().out.count("no runs stored") == 2


# ---- database passwords never reach a message --------------------------------------------

LEAKY = "s3cr@t#pa/ss?w"


def test_a_password_with_at_and_hash_parses_whole():
    from sketchwalk.store.target import parse_url

    url = parse_url(f"postgresql://me:{LEAKY}@db.example:5433/runs?sslmode=disable")
    assert (url.username, url.password, url.host, url.port) == ("me", LEAKY, "db.example", 5433)
    assert url.database == "runs" and url.query == {"sslmode": "disable"}
    assert parse_url("postgresql://me:p%40ss@h/db").password == "p@ss"


def test_a_wrong_password_with_at_and_hash_does_not_leak(capsys):
    from pg_testdb import require_pg_url
    from sqlalchemy.engine import make_url

    base = make_url(require_pg_url())
    raw = f"postgresql://{base.username}:{LEAKY}@{base.host}:{base.port}/{base.database}"
    assert main(["runs", "--db", raw]) == 2
    line = _one_line(capsys)
    assert "password authentication failed" in line
    for piece in ("s3cr", "t#pa", "pa/ss", "ss?w", LEAKY):
        assert piece not in line


def test_the_password_can_stay_out_of_the_url(monkeypatch, capsys):
    from pg_testdb import fresh_schema
    from sqlalchemy.engine import make_url

    with fresh_schema() as url:
        parsed = make_url(url)
        monkeypatch.setenv("SKETCHWALK_DB_PASSWORD", parsed.password)
        bare = parsed.set(password=None).render_as_string(hide_password=False)
        assert main(["runs", "--db", bare]) == 0
    assert "no runs stored" in capsys.readouterr().out
