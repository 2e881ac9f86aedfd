"""Output faults: stdout on a full device (/dev/full) is one line on stderr and exit 2, never a
traceback; a long run-id prefix is never echoed whole."""

from __future__ import annotations

import subprocess
import sys

import pytest
from known_runs import save_known

from sketchwalk.cli.main import main
from sketchwalk.store import open_store


def _full_stdout(args: list[str]) -> subprocess.CompletedProcess:
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "sketchwalk.cli.main", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )


@pytest.fixture(scope="module")
def known_db(tmp_path_factory):
    url = str(tmp_path_factory.mktemp("full") / "k.duckdb")
    with open_store(url) as store:
        run_id = save_known(store)
    return url, run_id


@pytest.mark.heavy
@pytest.mark.parametrize(
    "args",
    [
        ["runs"],
        ["runs", "--json"],
        ["trace", "{run}", "--text", "KEY-4242"],
        ["trace", "{run}", "--text", "KEY-4242", "--json"],
        ["export", "{run}", "--out", "{dir}", "--json"],
    ],
)
def test_stdout_on_a_full_device_is_one_line(known_db, tmp_path, args):
    url, run_id = known_db
    argv = [a.format(run=run_id, dir=tmp_path / "out") for a in args] + ["--db", url]
    out = _full_stdout(argv)
    assert out.returncode == 2, out.stderr
    assert out.stderr == "sketchwalk: error: cannot write the output: No space left on device\n"


@pytest.mark.heavy
def test_a_run_with_stdout_on_a_full_device_is_stored_and_one_line(tmp_path, tiny_model):
    db = str(tmp_path / "r.duckdb")
    out = _full_stdout(
        ["run", "The quick brown fox jumps over the lazy dog. " * 12, "--model", tiny_model, "--db", db,
         "--block-size", "16", "--max-new-tokens", "1", "--time-only"]
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.endswith(
        "sketchwalk: error: cannot write the output: No space left on device\n"
    )
    assert "Traceback" not in out.stderr
    with open_store(db) as store:  # the run was saved before its summary failed to print
        assert store.list_runs()["status"].tolist() == ["done"]


def test_a_long_prefix_is_cut_in_the_trace_error(known_db, capsys):
    url, _ = known_db
    assert main(["trace", "a" * 100_000, "--text", "KEY", "--db", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 200 and "is not a run id" in err
