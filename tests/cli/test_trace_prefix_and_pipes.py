"""`sketchwalk trace` takes the id prefix the app shows; a closed pipe ends a command quietly."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from known_runs import save_known

from sketchwalk.cli.main import main
from sketchwalk.store import open_store


@pytest.fixture
def many(tmp_path):
    """17 runs: two of them share a first character (16 hex digits)."""
    url = str(tmp_path / "many.duckdb")
    with open_store(url) as store:
        ids = [save_known(store) for _ in range(17)]
    return url, ids


def test_trace_accepts_the_8_character_prefix_the_app_shows(many, capsys):
    url, ids = many
    assert main(["trace", ids[3][:8], "--text", "KEY-4242", "--db", url, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_id"] == ids[3] and out["blocks"] == [2]


def test_trace_prefix_errors_are_one_line(many, capsys):
    url, ids = many
    first = Counter(i[0] for i in ids).most_common(1)[0][0]  # shared by at least two runs
    cases = {
        first: "matches several runs",
        "zzzz": "is not a run id or the start of one",
        "ffffffff-ffff": "no run id starts with",
    }
    if any(i.startswith("ffffffff-ffff") for i in ids):  # astronomically unlikely
        cases.pop("ffffffff-ffff")
    for prefix, message in cases.items():
        assert main(["trace", prefix, "--text", "KEY-4242", "--db", url]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


def test_runs_into_a_closed_pipe_prints_no_traceback(many):
    url, _ = many
    cmd = [sys.executable, "-m", "sketchwalk.cli.main", "runs", "--db", url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # `| head -0`: the reader is gone before the first row is written
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
    assert proc.returncode == 141


def test_runs_piped_into_head_prints_its_first_line_only(many):
    url, _ = many
    cmd = f"{sys.executable} -m sketchwalk.cli.main runs --db {url} | head -1"
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert out.stdout.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr


def test_resolve_run_id_on_postgresql(pg_url):
    """The prefix match is portable SQL (LIKE on the id): the same answers on PostgreSQL."""
    from sketchwalk.store.errors import UnknownRunError

    with open_store(pg_url) as store:
        ids = [save_known(store) for _ in range(17)]
        assert store.resolve_run_id(ids[5][:8].upper()) == ids[5]  # hex is case-blind
        first = Counter(i[0] for i in ids).most_common(1)[0][0]
        with pytest.raises(UnknownRunError, match="matches several runs"):
            store.resolve_run_id(first)
        with pytest.raises(UnknownRunError, match="not a run id"):
            store.resolve_run_id("x%")  # a LIKE wildcard is refused, not matched
