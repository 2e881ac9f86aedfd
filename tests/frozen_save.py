"""Freeze a process inside a save's COPY (a real SIGSTOP while the server waits for data).

Imported by the worker tests' job runners; run as a script it is `sketchwalk` with its first COPY
frozen: `python tests/frozen_save.py run --db URL ...` (a plain run frozen mid-save)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.csv as pacsv


@contextmanager
def stopped_inside_copy(active: bool = True) -> Iterator[None]:
    """While active, the first CSV buffer written for a COPY stops this process (a real SIGSTOP)
    inside `cursor.copy()`: the server has the COPY ... FROM STDIN and waits for its data."""
    if not active:
        yield
        return
    real = pacsv.write_csv
    stopped: list[bool] = []

    def write_then_stop(*args, **kwargs):
        if not stopped:
            stopped.append(True)
            os.kill(os.getpid(), signal.SIGSTOP)  # frozen here until SIGCONT
        return real(*args, **kwargs)

    pacsv.write_csv = write_then_stop
    try:
        yield
    finally:
        pacsv.write_csv = real


def stopped(pid: int) -> bool:
    """Whether the kernel has the process stopped (state 'T')."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def save_session(store, key: str) -> tuple[str, str] | None:
    """(state, query) of the server session saving under `key` (a job's claim, or a plain
    run's id), or None once it is gone."""
    import sqlalchemy as sa

    from sketchwalk.store.jobs import save_session_name

    with store.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT state, query FROM pg_stat_activity WHERE application_name = :n"),
            {"n": save_session_name(key)},
        ).first()
    return None if row is None else (row[0], row[1])


if __name__ == "__main__":
    from sketchwalk.cli.main import main

    with stopped_inside_copy():
        sys.exit(main(sys.argv[1:]))
