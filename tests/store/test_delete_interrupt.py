"""`delete` of many runs is one transaction: an unknown id, an error or a signal part-way
deletes none, and the interrupt line says exactly that."""

from __future__ import annotations

import os
import signal

import pytest
import sqlalchemy as sa
from store_fixtures import count_rows, saved_run

from sketchwalk.cli.main import main
from sketchwalk.store import UnknownRunError, open_store


def test_delete_runs_is_all_or_nothing(store):
    ids = [saved_run(store, seed=i)[0] for i in range(3)]
    with pytest.raises(UnknownRunError):
        store.delete_runs([*ids, "no-such-run"])
    assert set(store.run_ids()) == set(ids)  # nothing deleted on a typo
    store.delete_runs([ids[0], ids[2], ids[0]])  # a repeated id is one run
    assert store.run_ids() == [ids[1]]
    assert all(n == 0 for n in count_rows(store, ids[0]).values())
    assert any(n > 0 for n in count_rows(store, ids[1]).values())


class _SignalOnDelete:
    """Sends `signum` to this process just before the `nth` DELETE statement any engine runs
    (a delete of up to 500 runs is six statements: five run tables and the jobs)."""

    def __init__(self, signum: int, nth: int) -> None:
        self.signum, self.nth, self.seen = signum, nth, 0

    def __call__(self, conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            self.seen += 1
            if self.seen == self.nth:
                os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize(
    ("signum", "nth"), [(signal.SIGINT, 1), (signal.SIGTERM, 3), (signal.SIGTERM, 6)]
)
def test_a_signal_during_delete_deletes_nothing_and_says_so(db_path, capsys, signum, nth):
    with open_store(str(db_path)) as store:
        ids = [saved_run(store, seed=i)[0] for i in range(12)]
    hook = _SignalOnDelete(signum, nth)
    before = signal.getsignal(signal.SIGTERM)  # SIG_DFL, or what an earlier test installed
    sa.event.listen(sa.engine.Engine, "before_cursor_execute", hook)
    try:
        code = main(["delete", "--db", str(db_path), *ids])
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", hook)
    assert hook.seen >= nth  # the signal was sent while deleting
    assert code == 128 + signum
    err = capsys.readouterr().err
    name = signal.Signals(signum).name
    assert err == (
        f"sketchwalk: interrupted by {name}: no run was deleted "
        "(the 12 run(s) are deleted in one transaction)\n"
    )
    with open_store(str(db_path)) as store:
        assert set(store.run_ids()) == set(ids)
    assert signal.getsignal(signal.SIGTERM) == before  # handlers restored


def test_delete_prints_one_line_and_deletes_every_run(db_path, capsys):
    with open_store(str(db_path)) as store:
        ids = [saved_run(store, seed=i)[0] for i in range(4)]
    assert main(["delete", "--db", str(db_path), *ids]) == 0
    assert capsys.readouterr().out == "deleted 4 run(s)\n"
    with open_store(str(db_path)) as store:
        assert store.run_ids() == []


def test_a_plain_keyboard_interrupt_prints_interrupted(monkeypatch, capsys):
    from sketchwalk.cli import store as cli_store

    def stop(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_store, "cmd_runs", stop)
    assert main(["runs"]) == 130
    assert capsys.readouterr().err == "sketchwalk: interrupted\n"


@pytest.mark.heavy
def test_delete_on_a_full_disk_is_one_line_and_deletes_nothing(db_path):
    import subprocess
    import sys

    with open_store(str(db_path)) as store:
        ids = [saved_run(store, seed=i)[0] for i in range(5)]
    wal = db_path.with_name(db_path.name + ".wal")
    wal.symlink_to("/dev/full")  # every write to the log is refused: ENOSPC
    try:
        out = subprocess.run(
            [sys.executable, "-m", "sketchwalk.cli.main", "delete", "--db", str(db_path), *ids],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        wal.unlink()
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "no run was deleted" in out.stderr and "No space left on device" in out.stderr
    with open_store(str(db_path)) as store:
        assert set(store.run_ids()) == set(ids)
