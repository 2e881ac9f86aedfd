"""docker/entrypoint.py: environment to command lines, waiting for the store, the health check,
and the real thing: the app and a worker started through it on PostgreSQL."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from sketchwalk.store import StoreCorruptError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docker" / "entrypoint.py"


def _load():
    spec = importlib.util.spec_from_file_location("sketchwalk_entrypoint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ep = _load()


@pytest.mark.parametrize(
    ("role", "args", "env", "expected"),
    [
        ("app", [], {}, ["sketchwalk", "app", "--host", "0.0.0.0", "--port", "8501"]),
        (
            "app",
            ["--db", "x.duckdb"],
            {"SKETCHWALK_PORT": "9000", "SKETCHWALK_APP_WORKER": "0", "SKETCHWALK_DEVICE": "cpu"},
            ["sketchwalk", "app", "--host", "0.0.0.0", "--port", "9000", "--device", "cpu",
             "--no-worker", "--db", "x.duckdb"],
        ),
        ("app", [], {"SKETCHWALK_APP_WORKER": "yes"}, ["sketchwalk", "app", "--host", "0.0.0.0",
                                                       "--port", "8501"]),
        (
            "worker",
            ["--once"],
            {"SKETCHWALK_DEVICE": "cuda:0", "SKETCHWALK_STOP_GRACE_S": "30"},
            ["sketchwalk", "worker", "--device", "cuda:0", "--grace", "30", "--once"],
        ),
        ("worker", [], {}, ["sketchwalk", "worker"]),
        ("eval", ["--tasks", "lm"], {}, ["sketchwalk", "eval", "--tasks", "lm"]),
        ("runs", ["--json"], {}, ["sketchwalk", "runs", "--json"]),
        ("bash", ["-lc", "id"], {}, ["bash", "-lc", "id"]),
    ],
)  # fmt: skip
def test_roles_and_environment_become_command_lines(role, args, env, expected):
    assert ep.build_argv(role, args, env) == expected


def test_store_urls_are_classified_and_passwords_hidden():
    assert ep.backend("postgresql+psycopg://u:p@h/db") == "postgresql"
    assert ep.backend("/data/x.duckdb") == "duckdb" and ep.backend("sqlite:///x") == "sqlite"
    assert ep.safe_url("postgresql://sw:s3cret@db:5432/sw") == "postgresql://sw:***@db:5432/sw"
    assert ep.safe_url("duckdb:///data/x.duckdb") == "duckdb:///data/x.duckdb"
    assert ep.safe_url("postgresql://sw:p@ss#w/d?@db/sw") == "postgresql://sw:***@db/sw"


def test_a_password_beside_the_url_or_holding_at_signs_is_accepted():
    bare = "postgresql://sketchwalk@postgres:5432/sketchwalk"
    with pytest.raises(SystemExit):
        ep.require_password(bare, {})
    ep.require_password(bare, {"SKETCHWALK_DB_PASSWORD": "p@ss#word"})  # compose's way
    ep.require_password("postgresql://sketchwalk:p@ss#w/d?@postgres/sketchwalk", {})


def test_embedded_store_is_not_waited_for():
    def never(url):
        raise AssertionError("should not be opened here")

    ep.wait_for_store("duckdb:///data/x.duckdb", 5, opener=never)
    ep.wait_for_store("/data/x.duckdb", 5, opener=never)


def test_server_store_is_retried_until_it_opens():
    calls, naps, logs = [], [], []

    def flaky(url):
        calls.append(url)
        if len(calls) < 3:
            raise ConnectionError("connection refused")

    ep.wait_for_store("postgresql://u:pw@db/x", 60, flaky, naps.append, logs.append)
    assert len(calls) == 3 and naps == [1.0, 1.0]
    assert logs[0] == "entrypoint: waiting for store postgresql://u:***@db/x (connection refused)"
    assert "ready after 3 attempts" in logs[-1]


def test_waiting_gives_up_with_one_line_and_exit_2(capsys):
    def down(url):
        raise ConnectionError("connection refused\nmore detail")

    with pytest.raises(SystemExit) as info:
        ep.wait_for_store("postgresql://u:pw@db/x", 0, down, lambda s: None, lambda m: None)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        "entrypoint: error: store postgresql://u:***@db/x not reachable after 0 s: "
        "connection refused\n"
    )


def test_a_foreign_database_fails_at_once(capsys):
    calls = []

    def foreign(url):
        calls.append(url)
        raise StoreCorruptError("db holds other tables and is not a sketchwalk store")

    with pytest.raises(SystemExit):
        ep.wait_for_store("postgresql://u:pw@db/x", 60, foreign, lambda s: None, lambda m: None)
    assert len(calls) == 1 and "not a sketchwalk store" in capsys.readouterr().err


def test_waiting_on_a_real_server_creates_the_schema(pg_url):
    ep.wait_for_store(pg_url, 30)
    engine = sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        assert {"runs", "jobs", "block_scores"} <= set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_an_unreachable_server_times_out(capsys):
    port = _free_port()  # nothing listens there
    with pytest.raises(SystemExit) as info:
        ep.wait_for_store(f"postgresql://u:pw@127.0.0.1:{port}/x?connect_timeout=1", 1.5)
    assert info.value.code == 2
    assert "not reachable after 1.5 s" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)  # where `sketchwalk` is installed
    return dict(os.environ, PATH=f"{venv_bin}{os.pathsep}{os.environ['PATH']}", **extra)


def test_worker_role_waits_then_execs_the_worker(pg_url):
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "worker", "--once"],
        env=_env(SKETCHWALK_DB=pg_url, SKETCHWALK_DEVICE="cpu", SKETCHWALK_STOP_GRACE_S="5"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "ran 0 job(s), 0 failed" in out.stderr


def test_app_role_serves_on_postgresql_and_the_healthcheck_sees_it(pg_url, tmp_path):
    port = str(_free_port())
    env = _env(
        SKETCHWALK_DB=pg_url,
        SKETCHWALK_PORT=port,
        SKETCHWALK_HOST="127.0.0.1",
        SKETCHWALK_APP_WORKER="0",
    )
    health = [sys.executable, str(SCRIPT), "healthcheck"]
    assert subprocess.run(health, env=env, timeout=30).returncode == 1  # nothing serving yet
    log = (tmp_path / "app.log").open("w")
    app = subprocess.Popen([sys.executable, str(SCRIPT), "app"], env=env, stderr=log, stdout=log)
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(health, env=env, timeout=30).returncode != 0:
            assert app.poll() is None, (tmp_path / "app.log").read_text()
            assert time.monotonic() < deadline, "the app did not become healthy in 120 s"
            time.sleep(0.5)
        assert "serving the explorer" in (tmp_path / "app.log").read_text()
    finally:
        app.terminate()
        app.wait(30)


@pytest.mark.parametrize("role", ["app", "worker"])
def test_a_server_database_without_a_password_is_refused(role, capsys):
    env = {"SKETCHWALK_DB": "postgresql://sketchwalk:@postgres:5432/sketchwalk"}
    with pytest.raises(SystemExit) as stop:
        ep.main([role], env)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has no password" in err[0] and "POSTGRES_PASSWORD" in err[0]
