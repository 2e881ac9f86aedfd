"""One progress shape (fraction, message) for every long job, defined once."""

from __future__ import annotations

import io
import sys

from sketchwalk import progress
from sketchwalk.cli.eval import grid_progress
from sketchwalk.worker import lifecycle


def test_the_worker_and_the_cli_use_the_one_progress_type(monkeypatch):
    assert lifecycle.Progress is progress.Progress
    assert lifecycle.no_progress is progress.no_progress
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with grid_progress("eval") as report:
        for done in range(1, 4):
            report(done / 3, f"panel {done}")
    assert "100/100" in err.getvalue() and "panel 3" in err.getvalue()
